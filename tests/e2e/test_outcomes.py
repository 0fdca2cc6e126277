"""Every outcome of the filter's outcomes table, against real Envoy (policies/README.md)."""

import threading
import time

import stack

from conftest import new_key
from idemtest import (assert_first_seen_at, assert_local, assert_replay_of, assert_upstream_answer, counters,
                      delta, describe, dumps, post, wait_for)

CREATE = "/api/order/create"


def test_first_request_is_forwarded(idem, upstream):
    key = new_key()
    r = post(idem, CREATE, key)
    assert_upstream_answer(r, key=key, n=1)
    assert upstream.calls(key) == 1


def test_repeat_is_replayed_identically(idem, upstream):
    key = new_key()
    before = counters(idem, "create-order")
    first = post(idem, CREATE, key, headers={"x-demo-status": "201"})
    assert_upstream_answer(first, key=key, n=1, status=201)
    for _ in range(3):
        again = post(idem, CREATE, key, headers={"x-demo-status": "201"})
        assert_replay_of(again, first)
        # safe headers of the stored answer come back
        assert again.header("content-type") == "application/json", describe(again)
        assert again.header("x-order-id") == first.header("x-order-id"), describe(again)
    assert upstream.calls(key) == 1, "a replayed request reached the upstream"
    d = delta(before, counters(idem, "create-order"))
    assert d.get("forwarded") == 1 and d.get("replayed") == 3, "counters moved by %s" % d


def test_sf_string_key_is_the_same_key(idem, upstream):
    """IETF structured-field form `"abc"` names the same key as bare abc."""
    key = new_key()
    first = post(idem, CREATE, '"%s"' % key)
    assert first.status == 200, describe(first)
    again = post(idem, CREATE, key)
    assert_replay_of(again, first)
    assert upstream.calls('"%s"' % key) + upstream.calls(key) == 1


def test_repeat_while_in_flight_gets_409_with_retry_after(idem, upstream):
    key = new_key()
    before = counters(idem, "create-order")
    out = {}
    t = threading.Thread(target=lambda: out.setdefault(
        "first", post(idem, CREATE, key, headers={"x-demo-delay-ms": "2500"}, timeout=20)))
    t.start()
    try:
        wait_for(lambda: upstream.calls(key) == 1, 10, what="the first request to reach the upstream")
        r = post(idem, CREATE, key, headers={"x-demo-delay-ms": "2500"})
        assert_local(r, 409, "REQUEST_IN_PROGRESS", retry_after=True)
    finally:
        t.join(30)
    assert_upstream_answer(out["first"], key=key, n=1)
    # completed now: a repeat is a replay of the first answer
    assert_replay_of(post(idem, CREATE, key, headers={"x-demo-delay-ms": "2500"}), out["first"])
    assert upstream.calls(key) == 1
    d = delta(before, counters(idem, "create-order"))
    assert d.get("in_flight") == 1, "counters moved by %s" % d


def test_same_key_other_payload_is_422(idem, upstream):
    key = new_key()
    first = post(idem, CREATE, key, body={"sku": "A1", "qty": 1})
    assert first.status == 200, describe(first)
    r = post(idem, CREATE, key, body={"sku": "A1", "qty": 2})
    assert_local(r, 422, "IDEMPOTENCY_KEY_REUSED")
    # the query string is part of the default fingerprint too
    r = post(idem, CREATE + "?coupon=X", key, body={"sku": "A1", "qty": 1})
    assert_local(r, 422, "IDEMPOTENCY_KEY_REUSED")
    assert upstream.calls(key) == 1
    # and the original payload still replays
    assert_replay_of(post(idem, CREATE, key, body={"sku": "A1", "qty": 1}), first)


def test_missing_key_is_400(idem, upstream):
    before = upstream.calls()["total"]
    r = post(idem, CREATE, key=None)
    assert_local(r, 400, "IDEMPOTENCY_KEY_MISSING")
    assert upstream.calls()["total"] == before, "a request without a key reached the upstream"


def test_invalid_keys_are_400(idem, upstream):
    before = upstream.calls()["total"]
    too_long = "k" * 300
    assert_local(post(idem, CREATE, too_long), 400, "IDEMPOTENCY_KEY_INVALID")
    # 255 bytes is still fine
    ok = new_key()[:20] + "x" * 235
    assert post(idem, CREATE, ok).status == 200
    # a control character (TAB survives HTTP/1.1 parsing inside a header value)
    assert_local(post(idem, CREATE, "abc\tdef-" + new_key()), 400, "IDEMPOTENCY_KEY_INVALID")
    # a control character inside a body key (JSON escape)
    r = idem.request("POST", "/api/pay/callback", headers={"content-type": "application/json"},
                     body=b'{"transaction_id": "tx\\u0001-' + new_key().encode() + b'"}')
    assert_local(r, 400, "IDEMPOTENCY_KEY_INVALID")
    assert upstream.calls()["total"] == before + 1, "an invalid key reached the upstream"


def test_body_too_large_is_413(idem, upstream):
    key = new_key()
    before = counters(idem, "small-body")
    r = post(idem, "/t/small-body", key, body={"blob": "x" * 2000})
    assert_local(r, 413, "IDEMPOTENCY_BODY_TOO_LARGE")
    assert upstream.calls(key) == 0
    # a body under the limit goes through
    assert_upstream_answer(post(idem, "/t/small-body", new_key(), body={"blob": "x" * 500}))
    assert delta(before, counters(idem, "small-body")).get("body_too_large") == 1


def test_on_completed_reject_answers_the_duplicate_response(idem, upstream):
    key = new_key()
    before = counters(idem, "reject-dup")
    first = post(idem, "/t/reject", key)
    assert_upstream_answer(first, key=key, n=1)
    r = post(idem, "/t/reject", key)
    j = assert_local(r, 409, "ORDER_ALREADY_SUBMITTED")
    assert j["message"] == "请勿重复提交", describe(r)
    assert_first_seen_at(j, r)
    assert r.header("idempotent-replayed") is None
    assert upstream.calls(key) == 1
    assert delta(before, counters(idem, "reject-dup")).get("rejected_duplicate") == 1


def test_shadow_mode_forwards_everything_and_counts(idem, upstream):
    key = new_key()
    before = counters(idem, "shadow")
    first = post(idem, "/t/shadow", key)
    second = post(idem, "/t/shadow", key)
    assert_upstream_answer(first, key=key, n=1)
    assert_upstream_answer(second, key=key, n=2)  # would have been a replay; shadow never blocks
    # would have been 422 / 400: still forwarded
    assert_upstream_answer(post(idem, "/t/shadow", key, body={"other": True}), key=key, n=3)
    assert_upstream_answer(post(idem, "/t/shadow", None))
    assert upstream.calls(key) == 3
    d = delta(before, counters(idem, "shadow"))
    # Would have blocked: the replay, the 422 and the missing key.
    assert d.get("shadow_would_block", 0) == 3, "counters moved by %s" % d


def test_query_key(idem, upstream):
    key = new_key()
    first = post(idem, "/t/query?key=" + key, None)
    assert_upstream_answer(first, key=key, n=1)
    assert_replay_of(post(idem, "/t/query?key=" + key, None), first)
    assert_local(post(idem, "/t/query", None), 400, "IDEMPOTENCY_KEY_MISSING")
    assert upstream.calls(key) == 1


def test_a_query_key_that_is_not_utf8_once_decoded_is_refused_never_merged(idem, upstream):
    # caf%E9 and caf%E8 are two Latin-1 strings: decoded lossily both were one key (the second
    # got the first's answer). Not UTF-8: 400, naming the source, and nothing forwarded.
    base = new_key()
    total = upstream.calls()["total"]
    for raw in (base + "-caf%E9", base + "-caf%E8", "%FF"):
        j = assert_local(post(idem, "/t/query?key=" + raw, None), 400, "IDEMPOTENCY_KEY_INVALID")
        assert "query parameter key is not UTF-8" in j["message"], j
    assert upstream.calls()["total"] == total
    # The same text in UTF-8 is a key like any other.
    first = post(idem, "/t/query?key=" + base + "-caf%C3%A9", None)
    assert first.status == 200 and first.header("idempotent-replayed") is None, describe(first)
    assert_replay_of(post(idem, "/t/query?key=" + base + "-caf%C3%A9", None), first)


def test_optional_key_lets_keyless_requests_through(idem, upstream):
    before = upstream.calls()["total"]
    assert_upstream_answer(post(idem, "/t/optional", None))
    assert_upstream_answer(post(idem, "/t/optional", None))
    assert upstream.calls()["total"] == before + 2
    key = new_key()
    first = post(idem, "/t/optional", key)
    assert_replay_of(post(idem, "/t/optional", key), first)


def test_policy_matched_by_envoy_route_name(idem, upstream):
    assert_local(post(idem, "/t/by-name", None), 400, "IDEMPOTENCY_KEY_MISSING")
    key = new_key()
    first = post(idem, "/t/by-name", key)
    assert_replay_of(post(idem, "/t/by-name", key), first)
    assert upstream.calls(key) == 1


def test_path_template_matches_one_segment_only(idem, upstream):
    # /api/orders/{id}/pay is protected ...
    assert_local(post(idem, "/api/orders/42/pay", None), 400, "IDEMPOTENCY_KEY_MISSING")
    key = new_key()
    first = post(idem, "/api/orders/42/pay", key)
    assert_replay_of(post(idem, "/api/orders/42/pay", key), first)
    # ... other paths under the same Envoy route match no policy and pass untouched
    assert_upstream_answer(post(idem, "/api/orders/42/items", None))
    assert_upstream_answer(post(idem, "/api/orders/42/pay/extra", None))
    assert_upstream_answer(post(idem, "/api/orders/42", None))
    # method is part of the match: GET on the template path passes
    r = idem.request("GET", "/api/orders/42/pay")
    assert_upstream_answer(r)
    assert upstream.calls(key) == 1


def test_route_without_policy_is_untouched(idem, upstream):
    before = upstream.calls()["total"]
    key = new_key()
    a = post(idem, "/anything/else", key)
    b = post(idem, "/anything/else", key)
    assert_upstream_answer(a, key=key, n=1)
    assert_upstream_answer(b, key=key, n=2)
    assert upstream.calls()["total"] == before + 2


def test_canonical_json_fingerprint(idem, upstream):
    key = new_key()
    first = idem.request("POST", "/t/canonical", headers={"Idempotency-Key": key, "content-type": "application/json"},
                         body=b'{"a": 1, "b": [1, 2], "c": {"y": 2, "x": 1}}')
    assert_upstream_answer(first, key=key, n=1)
    same = idem.request("POST", "/t/canonical", headers={"Idempotency-Key": key, "content-type": "application/json"},
                        body=b'{"c":{"x":1,"y":2},"b":[1,2],"a":1}')
    assert_replay_of(same, first)
    other = idem.request("POST", "/t/canonical", headers={"Idempotency-Key": key, "content-type": "application/json"},
                         body=b'{"c":{"x":1,"y":2},"b":[2,1],"a":1}')
    assert_local(other, 422, "IDEMPOTENCY_KEY_REUSED")
    assert upstream.calls(key) == 1
    # Numbers by their exact decimal value, never through floating point: two 20-digit amounts
    # that differ in the last digit (one f64 for both) are two requests; 1e2 and 100.0 are 100.
    big = new_key()
    first = idem.request("POST", "/t/canonical", headers={"Idempotency-Key": big, "content-type": "application/json"},
                         body=b'{"amount": 12345678901234567890, "fee": 1e2}')
    assert_upstream_answer(first, key=big, n=1)
    same = idem.request("POST", "/t/canonical", headers={"Idempotency-Key": big, "content-type": "application/json"},
                        body=b'{"fee":100.0,"amount":12345678901234567890}')
    assert_replay_of(same, first)
    off_by_one = idem.request("POST", "/t/canonical",
                              headers={"Idempotency-Key": big, "content-type": "application/json"},
                              body=b'{"fee":100,"amount":12345678901234567891}')
    assert_local(off_by_one, 422, "IDEMPOTENCY_KEY_REUSED")
    assert upstream.calls(big) == 1


def test_payment_callback_keyed_by_body_replays_first_success(idem, upstream):
    txn = new_key("tx")
    body = {"transaction_id": txn, "amount": 1999, "currency": "CNY", "status": "PAID"}
    first = idem.request("POST", "/api/pay/callback", headers={"content-type": "application/json"},
                         body=dumps(body))
    j = assert_upstream_answer(first)
    assert j["code"] == "SUCCESS" and j["transaction_id"] == txn, describe(first)
    # the provider retries with the same event re-serialized, from another connection/signature
    reserialized = dumps(dict(reversed(list(body.items()))), indent=2)
    for auth in (None, "Signature provider-2"):
        again = idem.request("POST", "/api/pay/callback",
                             headers={"content-type": "application/json", **({"authorization": auth} if auth else {})},
                             body=reserialized)
        assert_replay_of(again, first)
    assert upstream.calls(transaction_id=txn) == 1
    # a numeric transaction id is a key too
    num = int(time.time() * 1000) % 10**12
    first_num = idem.request("POST", "/api/pay/callback", headers={"content-type": "application/json"},
                             body=dumps({"transaction_id": num, "amount": 1}))
    assert first_num.status == 200, describe(first_num)
    assert_replay_of(idem.request("POST", "/api/pay/callback", headers={"content-type": "application/json"},
                                  body=dumps({"amount": 1, "transaction_id": num})), first_num)


def test_payment_callback_without_usable_key_is_400(idem, upstream):
    before = upstream.calls()["total"]
    for raw in (b'{"amount": 1}', b"not json", b'{"transaction_id": {"nested": 1}}', b'{"transaction_id": null}'):
        r = idem.request("POST", "/api/pay/callback", headers={"content-type": "application/json"}, body=raw)
        assert_local(r, 400, "IDEMPOTENCY_KEY_MISSING")
    assert upstream.calls()["total"] == before


def test_a_1_mb_order_on_the_shipped_policy_is_accepted_and_replayed(make_envoy, upstream):
    """policies/create-order.toml as shipped (no max_body_bytes: the default, Envoy's own 1 MiB
    buffer limit) and Envoy's default buffer limits: a 1 MB order runs once and its repeat is
    replayed; the same key with one byte changed is a reused key."""
    env = make_envoy((stack.REPO / "policies" / "create-order.toml").read_text(),
                     [{"name": "create-order", "match": {"prefix": "/api/order/create"}, "idem": True}])
    key = new_key("big")
    lines = "".join('{"sku":"SKU-%06d","qty":%d},' % (i, i % 7 + 1) for i in range(34_000))
    body = ('{"lines":[%s{}]}' % lines).encode()
    body += b" " * (1_000_000 - len(body))
    assert len(body) == 1_000_000
    first = post(env, "/api/order/create", key, body=body, timeout=30)
    assert_upstream_answer(first, key=key, n=1)
    assert_replay_of(post(env, "/api/order/create", key, body=body, timeout=30), first)
    changed = body[:-1] + b"\n"
    assert_local(post(env, "/api/order/create", key, body=changed, timeout=30), 422, "IDEMPOTENCY_KEY_REUSED")
    assert upstream.calls(key) == 1
