"""Scoping and replay hygiene: whose answer, which headers, how big."""

from conftest import new_key
from idemtest import (assert_first_seen_at, assert_local, assert_replay_of, assert_upstream_answer, counters, delta,
                      describe, post)

CREATE = "/api/order/create"


def test_other_authorization_never_receives_anothers_response(idem, upstream):
    key = new_key()
    alice = post(idem, CREATE, key, auth="Bearer alice")
    ja = assert_upstream_answer(alice, key=key, n=1)
    assert ja["authorization"] == "Bearer alice"

    bob = post(idem, CREATE, key, auth="Bearer bob")
    jb = assert_upstream_answer(bob, key=key, n=2)  # a fresh execution for bob, not alice's replay
    assert jb["authorization"] == "Bearer bob", describe(bob)
    assert bob.body != alice.body

    # No Authorization at all is no identity: refused, never merged into one "anonymous" caller.
    anonymous = idem.request("POST", CREATE, headers={"Idempotency-Key": key}, body={"sku": "A1"}, anonymous=True)
    assert_local(anonymous, 400, "IDEMPOTENCY_SCOPE_MISSING")

    assert_replay_of(post(idem, CREATE, key, auth="Bearer alice"), alice)
    assert_replay_of(post(idem, CREATE, key, auth="Bearer bob"), bob)
    assert upstream.calls(key) == 2


def test_set_cookie_is_not_replayed(idem, upstream):
    key = new_key()
    headers = {"x-demo-set-cookie": "session=s3cr3t; Path=/; HttpOnly"}
    first = post(idem, CREATE, key, headers=headers)
    assert_upstream_answer(first, key=key, n=1)
    assert first.header("set-cookie") == "session=s3cr3t; Path=/; HttpOnly", describe(first)
    again = post(idem, CREATE, key, headers=headers)
    assert_replay_of(again, first)
    assert again.header_all("set-cookie") == [], "set-cookie replayed: %s" % describe(again)
    # other response headers are replayed
    assert again.header("x-order-id") == first.header("x-order-id"), describe(again)
    assert again.header("cache-control") == "no-store", describe(again)
    # content-length is Envoy's own, and matches the body
    assert again.header("content-length") in (None, str(len(again.body))), describe(again)
    assert upstream.calls(key) == 1


def test_oversized_response_becomes_a_tombstone(idem, upstream):
    key = new_key()
    before = counters(idem, "tombstone")
    headers = {"x-demo-body-bytes": "4096"}
    first = post(idem, "/t/tombstone", key, headers=headers)
    j = assert_upstream_answer(first, key=key, n=1)
    assert len(first.body) > 4096 and len(j["padding"]) == 4096
    again = post(idem, "/t/tombstone", key, headers=headers)
    jd = assert_local(again, 409, "DUPLICATE_REQUEST")
    assert_first_seen_at(jd, again)
    assert again.header("idempotent-replayed") is None
    assert upstream.calls(key) == 1, "a tombstoned key ran the business again"
    # a small answer on the same route is still replayed
    small = new_key()
    first_small = post(idem, "/t/tombstone", small)
    assert_replay_of(post(idem, "/t/tombstone", small), first_small)
    d = delta(before, counters(idem, "tombstone"))
    assert d.get("tombstoned") == 1, "counters moved by %s" % d


def test_replay_keeps_status_and_json_body_exactly(idem, upstream):
    key = new_key()
    first = post(idem, CREATE, key, headers={"x-demo-status": "202"}, body={"名前": "注文", "qty": 3})
    assert_upstream_answer(first, key=key, status=202)
    again = post(idem, CREATE, key, headers={"x-demo-status": "202"}, body={"名前": "注文", "qty": 3})
    assert_replay_of(again, first)
    assert again.json() == first.json()


def test_duplicate_answer_is_never_a_5xx(idem, upstream):
    key = new_key()
    post(idem, "/t/reject", key)
    r = post(idem, "/t/reject", key)
    assert 200 <= r.status < 500, describe(r)
    assert_local(r, 409, "ORDER_ALREADY_SUBMITTED")


def test_custom_duplicate_status_code_and_message(idem, upstream):
    key = new_key()
    first = post(idem, "/t/dup-200", key)
    assert_upstream_answer(first, key=key, n=1)
    r = post(idem, "/t/dup-200", key)
    j = assert_local(r, 200, "ALREADY_PROCESSED")
    assert j["message"] == "this callback was already processed", describe(r)
    assert_first_seen_at(j, r)
    assert upstream.calls(key) == 1


def test_replay_has_one_date_and_no_hop_by_hop_headers(idem, upstream):
    key = new_key()
    first = post(idem, CREATE, key)
    again = post(idem, CREATE, key)
    assert_replay_of(again, first)
    # Envoy's own date and length, once each: the stored ones are not replayed beside them.
    assert len(again.header_all("date")) == 1, describe(again)
    assert again.header_all("content-length") == [str(len(again.body))], describe(again)
    for hop in ("transfer-encoding", "keep-alive", "upgrade", "proxy-connection"):
        assert again.header(hop) is None, describe(again)


def test_same_key_on_another_route_is_another_key(idem, upstream):
    key = new_key()
    a = post(idem, CREATE, key)
    b = post(idem, "/api/orders/9/pay", key)
    assert_upstream_answer(a, key=key, n=1)
    assert_upstream_answer(b, key=key, n=2)  # not a/422: the route is part of the stored key
    assert upstream.calls(key) == 2


def test_same_key_on_another_path_of_the_same_policy_is_422(idem, upstream):
    key = new_key()
    first = post(idem, "/api/orders/1/pay", key)
    assert_upstream_answer(first, key=key, n=1)
    assert_local(post(idem, "/api/orders/2/pay", key), 422, "IDEMPOTENCY_KEY_REUSED")
    assert upstream.calls(key) == 1
