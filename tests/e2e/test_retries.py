"""Concurrency, failures and retries: exactly-once execution behind the gateway."""

import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import stack
from conftest import new_key
from idemtest import (assert_local, assert_outcome_unknown, assert_replay_of, assert_upstream_answer, counters, delta,
                      describe, listener_stats, post, wait_for, wait_idle)

CREATE = "/api/order/create"


def test_100_concurrent_identical_requests_execute_once(idem, upstream):
    key = new_key()
    n = 100
    barrier = threading.Barrier(n)
    headers = {"x-demo-delay-ms": "400"}

    def one(_):
        barrier.wait(10)
        return post(idem, CREATE, key, headers=headers, timeout=30)

    with ThreadPoolExecutor(max_workers=n) as pool:
        answers = list(pool.map(one, range(n)))

    assert upstream.calls(key) == 1, "upstream executed %d times for one key" % upstream.calls(key)
    fresh = [r for r in answers if r.status == 200 and r.header("idempotent-replayed") is None]
    assert len(fresh) == 1, "expected exactly one fresh upstream answer, got %d: %s" % (
        len(fresh), [describe(r) for r in fresh[:3]])
    first = fresh[0]
    assert_upstream_answer(first, key=key, n=1)
    in_progress = replays = 0
    for r in answers:
        if r is first:
            continue
        if r.status == 409:
            assert_local(r, 409, "REQUEST_IN_PROGRESS", retry_after=True)
            in_progress += 1
        else:
            assert_replay_of(r, first)
            replays += 1
    assert in_progress + replays == n - 1
    print("100 concurrent: 1 forwarded, %d in progress (409), %d replays" % (in_progress, replays))


def test_5xx_releases_the_claim_and_the_retry_runs(idem, upstream):
    key = new_key()
    before = counters(idem, "create-order")
    first = post(idem, CREATE, key, headers={"x-demo-fail-first": "1"})
    assert first.status == 500, describe(first)
    retry = post(idem, CREATE, key, headers={"x-demo-fail-first": "1"})
    assert_upstream_answer(retry, key=key, n=2)
    assert upstream.calls(key) == 2
    # the successful answer is the one remembered
    assert_replay_of(post(idem, CREATE, key, headers={"x-demo-fail-first": "1"}), retry)
    assert upstream.calls(key) == 2
    assert delta(before, counters(idem, "create-order")).get("released", 0) == 1


def test_forgotten_status_409_releases_the_claim(idem, upstream):
    key = new_key()
    first = post(idem, CREATE, key, headers={"x-demo-status": "409"})
    assert first.status == 409 and first.json().get("order_id"), describe(first)
    second = post(idem, CREATE, key, headers={"x-demo-status": "409"})
    assert second.status == 409 and second.header("idempotent-replayed") is None, describe(second)
    assert upstream.calls(key) == 2


def test_4xx_answer_is_remembered(idem, upstream):
    key = new_key()
    first = post(idem, CREATE, key, headers={"x-demo-status": "400"})
    assert first.status == 400 and first.json().get("order_id"), describe(first)
    assert_replay_of(post(idem, CREATE, key, headers={"x-demo-status": "400"}), first)
    assert upstream.calls(key) == 1


def _client_gives_up(env, upstream, route, path, key, delay_ms, client_timeout):
    """Send a request, wait until the upstream has started working on it, then abandon it (close the
    connection without reading the answer) once client_timeout seconds have passed -- what an SDK
    with a short timeout does. Deterministic: the request was certainly forwarded, and this returns
    only once the gateway has seen the client leave and held the claim (the close reaches Envoy
    asynchronously; a retry sent before that would still find the claim in flight)."""
    body = b'{"sku": "A1", "qty": 1}'
    held_before = counters(env, route).get("held", 0)
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", env.listen_port), timeout=10) as s:
        s.sendall(("POST %s HTTP/1.1\r\nHost: idem.test\r\nContent-Type: application/json\r\n"
                   "Authorization: %s\r\nIdempotency-Key: %s\r\nx-demo-delay-ms: %d\r\nContent-Length: %d\r\n\r\n"
                   % (path, stack.DEFAULT_AUTH, key, delay_ms, len(body))).encode() + body)
        wait_for(lambda: upstream.calls(key) == 1, 10, what="the abandoned request to reach the upstream")
        # A duration, not a state: the client's own timeout runs out.
        time.sleep(max(0.0, client_timeout - (time.monotonic() - started)))
        s.setblocking(False)
        try:
            early = s.recv(65536)
        except BlockingIOError:
            early = b""
        assert not early, "the answer came back before the client gave up: %r" % early[:200]
    wait_for(lambda: counters(env, route).get("held", 0) > held_before, 5,
             what="the gateway to hold the abandoned request's claim")
    return started


def test_client_timeout_and_retries_never_execute_twice(idem, upstream):
    """SDK times out (1 s) while the upstream still works (3 s), then retries with the same key."""
    key = new_key()
    before = counters(idem, "create-order")
    started = _client_gives_up(idem, upstream, "create-order", CREATE, key, 3000, 1.0)
    assert upstream.calls(key) == 1
    statuses = []
    # The client left, so Envoy reset the upstream request: the outcome is unknown. Retries while
    # the upstream still works ...
    while time.monotonic() - started < 2.5:
        r = post(idem, CREATE, key, headers={"x-demo-delay-ms": "3000"}, timeout=10)
        assert_outcome_unknown(r)
        statuses.append(r.status)
        time.sleep(0.3)  # the retrying client's pace
    # ... and after it finished (its answer went nowhere): held, never taken over. A duration: the
    # upstream's 3 s run cannot be observed ending (the demo upstream counts a call when it starts,
    # and its answer goes to a reset connection), so its run time is waited out.
    time.sleep(max(0.0, 3.8 - (time.monotonic() - started)))
    r = post(idem, CREATE, key, headers={"x-demo-delay-ms": "3000"}, timeout=10)
    assert_outcome_unknown(r)
    assert upstream.calls(key) == 1, "the business ran %d times" % upstream.calls(key)
    assert len(statuses) >= 1
    d = delta(before, counters(idem, "create-order"))
    assert d.get("held", 0) == 1, "claim not counted as held once: %s" % d


def test_upstream_timeout_holds_the_claim(idem, upstream):
    """Envoy's route timeout (1 s) fires while the upstream works (2.5 s): 504, outcome unknown."""
    key = new_key()
    before = counters(idem, "timeouts")
    started = time.monotonic()
    first = post(idem, "/t/timeouts", key, headers={"x-demo-delay-ms": "2500"})
    assert first.status == 504, describe(first)
    r = post(idem, "/t/timeouts", key, headers={"x-demo-delay-ms": "10"})
    assert_outcome_unknown(r)
    # The upstream has finished its (first and only) execution. A duration: its 2.5 s run cannot be
    # observed ending (the demo upstream counts a call when it starts; Envoy reset that request).
    time.sleep(max(0.0, 3.0 - (time.monotonic() - started)))
    r = post(idem, "/t/timeouts", key, headers={"x-demo-delay-ms": "10"})
    assert_outcome_unknown(r)
    assert upstream.calls(key) == 1
    d = delta(before, counters(idem, "timeouts"))
    assert d.get("held", 0) == 1 and d.get("released", 0) == 0, "counters moved by %s" % d


def test_upstream_reset_holds_the_claim(idem, upstream):
    key = new_key()
    first = post(idem, CREATE, key, headers={"x-demo-reset": "1"})
    assert first.status in (502, 503), describe(first)
    r = post(idem, CREATE, key, headers={"x-demo-reset": "1"})
    assert_outcome_unknown(r)
    assert upstream.calls(key) == 1


def test_unknown_outcome_is_held_past_the_lease_until_its_hold_ends(idem, upstream):
    """lock_ttl = 2 s, unknown_outcome_hold = 4 s: an abandoned request's key is not taken over
    when its lease ends (an SDK honouring Retry-After would come back exactly then), only when
    the hold ends."""
    key = new_key()
    started = _client_gives_up(idem, upstream, "short-lease", "/t/short-lease", key, 1000, 0.5)
    held_at = time.monotonic()  # the hold began no later than this (the helper saw it counted)
    assert_outcome_unknown(post(idem, "/t/short-lease", key))
    # Durations are the scenario here: the lease and the hold end by the clock.
    time.sleep(max(0.0, 3.0 - (time.monotonic() - started)))  # past the 2 s lease
    assert_outcome_unknown(post(idem, "/t/short-lease", key))
    time.sleep(max(0.0, 4.3 - (time.monotonic() - held_at)))  # past the 4 s hold
    retry = post(idem, "/t/short-lease", key)
    assert_upstream_answer(retry, key=key, n=2)
    assert_replay_of(post(idem, "/t/short-lease", key), retry)
    assert upstream.calls(key) == 2


def test_store_full_of_in_flight_claims_is_503_then_recovers(make_envoy, upstream):
    policy = """
[shared]
buckets = 1
entries_per_bucket = 2
max_response_bytes = 4096

[[route]]
name = "create-order"
match = { method = "POST", path = "/api/order/create" }
"""
    env = make_envoy(policy)
    keys = [new_key() for _ in range(2)]
    results = {}

    def slow(k):
        results[k] = post(env, CREATE, k, headers={"x-demo-delay-ms": "2500"}, timeout=20)

    threads = [threading.Thread(target=slow, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: all(upstream.calls(k) == 1 for k in keys), 10, what="both claims in flight")
        third = new_key()
        r = post(env, CREATE, third)
        assert_local(r, 503, "IDEMPOTENCY_STORE_UNAVAILABLE")
        assert upstream.calls(third) == 0
    finally:
        for t in threads:
            t.join(30)
    for k in keys:
        assert_upstream_answer(results[k], key=k, n=1)
    # completed entries can be evicted: new keys work again
    fourth = new_key()
    assert_upstream_answer(post(env, CREATE, fourth), key=fourth, n=1)
    # This Envoy's one refusal: the third key, while the store was full.
    assert counters(env, "create-order").get("store_error", 0) == 1


def test_slow_request_keeps_its_lease_while_the_gateway_lives(idem, upstream):
    """A's lease is 2 s and A runs 5 s: the gateway renews the lease while A waits for the
    upstream, so B (at 2.8 s, then every second, as Retry-After says) is told "in progress" and
    finally gets A's answer. A lease ends only when the gateway that holds it died."""
    key = new_key()
    out = {}
    t = threading.Thread(target=lambda: out.setdefault(
        "a", post(idem, "/t/short-lease", key, headers={"x-demo-delay-ms": "5000"}, timeout=20)))
    t.start()
    try:
        wait_for(lambda: upstream.calls(key) == 1, 10, what="A to reach the upstream")
        reached = time.monotonic()
        time.sleep(2.8)  # a duration: past A's first lease (by the clock), A is still running
        answers = []
        # B polls while A certainly still runs (A's upstream answers 5 s after it was reached;
        # polling closer to that would race A's completion, not test the lease).
        while time.monotonic() - reached < 4.2:
            r = post(idem, "/t/short-lease", key)
            answers.append(r)
            assert_local(r, 409, "REQUEST_IN_PROGRESS", retry_after=True)
            time.sleep(1.0)  # B's pace: Retry-After says 1 s
    finally:
        t.join(30)
    a = out["a"]
    assert_upstream_answer(a, key=key, n=1)
    assert len(answers) >= 1
    assert_replay_of(post(idem, "/t/short-lease", key), a)
    assert upstream.calls(key) == 1


def test_completed_key_expires_after_ttl(idem, upstream):
    key = new_key()
    first = post(idem, "/t/short-ttl", key)
    assert_upstream_answer(first, key=key, n=1)
    assert_replay_of(post(idem, "/t/short-ttl", key), first)
    time.sleep(3.0)  # a duration: past the 2 s ttl, the record expires by the clock
    assert_upstream_answer(post(idem, "/t/short-ttl", key), key=key, n=2)


def test_remember_only_2xx_releases_a_4xx(idem, upstream):
    key = new_key()
    first = post(idem, "/t/remember-2xx", key, headers={"x-demo-status": "400"})
    assert first.status == 400 and first.header("idempotent-replayed") is None, describe(first)
    second = post(idem, "/t/remember-2xx", key)
    assert_upstream_answer(second, key=key, n=2)
    assert_replay_of(post(idem, "/t/remember-2xx", key), second)
    assert upstream.calls(key) == 2


def test_client_gone_while_body_buffered_releases_the_claim(idem, upstream):
    """The request never reached the upstream (client left mid-body): a retry must run."""
    key = new_key()
    body = b'{"sku": "A1", "qty": 1, "note": "' + b"x" * 200 + b'"}'
    before = listener_stats(idem)
    with socket.create_connection(("127.0.0.1", idem.listen_port), timeout=5) as s:
        s.sendall(b"POST /api/order/create HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Idempotency-Key: " + key.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:40])
        wait_for(lambda: listener_stats(idem)["downstream_rq_total"] > before["downstream_rq_total"], 5,
                 what="Envoy to start on the request (headers and the first 40 bytes of the body)")
    # The client left with its request open: Envoy counts that once it has dropped the stream.
    wait_for(lambda: listener_stats(idem)["downstream_cx_destroy_remote_active_rq"]
             > before["downstream_cx_destroy_remote_active_rq"], 5, what="Envoy to drop the abandoned request")
    assert upstream.calls(key) == 0
    r = idem.request("POST", CREATE, headers={"Idempotency-Key": key, "content-type": "application/json"}, body=body)
    assert_upstream_answer(r, key=key, n=1)


def test_chunked_request_body_has_the_same_fingerprint(idem, upstream):
    import http.client
    key = new_key()
    body = b'{"sku": "A1", "qty": 1, "lines": [' + b",".join(b'"line-%d"' % i for i in range(400)) + b"]}"
    first = idem.request("POST", CREATE, headers={"Idempotency-Key": key, "content-type": "application/json"},
                         body=body)
    assert_upstream_answer(first, key=key, n=1)
    conn = http.client.HTTPConnection("127.0.0.1", idem.listen_port, timeout=10)
    try:
        conn.request("POST", CREATE, body=iter([body[:100], body[100:3000], body[3000:]]),
                     headers={"Idempotency-Key": key, "content-type": "application/json",
                              "authorization": stack.DEFAULT_AUTH}, encode_chunked=True)
        resp = conn.getresponse()
        data = resp.read()
        assert resp.status == first.status and data == first.body, (resp.status, data[:200])
        assert resp.getheader("idempotent-replayed") == "true"
    finally:
        conn.close()
    assert upstream.calls(key) == 1


def test_header_only_answer_is_replayed(idem, upstream):
    key = new_key()
    first = post(idem, CREATE, key, headers={"x-demo-status": "204"})
    assert first.status == 204 and first.body == b"", describe(first)
    again = post(idem, CREATE, key, headers={"x-demo-status": "204"})
    assert_replay_of(again, first)
    assert again.header("x-order-id") == first.header("x-order-id"), describe(again)
    assert upstream.calls(key) == 1


def test_release_and_hold_log_lines_name_route_key_and_cause(idem, upstream):
    """Every interception log line is `idem: <action> route=<name> key=<8 chars>… cause=<cause>`,
    also when a claim is released (5xx) or held (outcome unknown): that is the key an operator
    needs to find."""
    released, held = "R" + new_key()[2:12], "H" + new_key()[2:12]
    assert post(idem, CREATE, released, headers={"x-demo-fail-first": "1"}).status == 500
    assert post(idem, "/t/timeouts", held, headers={"x-demo-delay-ms": "2000"}).status == 504

    def lines(action):
        return [l for l in idem.log_text().splitlines() if re.search(r"idem: %s\b" % action, l)]

    cases = (("released", released, "create-order"), ("held", held, "timeouts"))
    # Wait for this test's own lines (earlier tests wrote released/held lines of their own), then
    # check their format.
    wait_for(lambda: all(any(key[:8] in l for l in lines(action)) for action, key, _ in cases), 5,
             what="this test's released and held log lines")
    for action, key, route in cases:
        mine = [l for l in lines(action) if "route=%s " % route in l]
        assert any(re.search(r"route=%s key=%s\S* cause=\S+" % (route, re.escape(key[:8])), l) for l in mine), \
            "no `idem: %s route=%s key=%s… cause=…` line; %s lines: %s" % (action, route, key[:8], action, mine[-3:])


def test_many_keys_with_concurrent_duplicates_each_execute_once(idem, upstream):
    """50 keys x 4 simultaneous copies each (200 requests at once, across both workers and many
    buckets): every key runs exactly once."""
    keys = [new_key("m") for _ in range(50)]
    jobs = [k for k in keys for _ in range(4)]
    barrier = threading.Barrier(len(jobs))

    def one(k):
        barrier.wait(10)
        return k, post(idem, CREATE, k, headers={"x-demo-delay-ms": "200"}, timeout=30)

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        answers = list(pool.map(one, jobs))
    runs = {k: upstream.calls(k) for k in keys}
    assert all(n == 1 for n in runs.values()), "keys executed more than once: %s" % {
        k: n for k, n in runs.items() if n != 1}
    for k, r in answers:
        assert r.status in (200, 409), "%s: %s" % (k, describe(r))
        if r.status == 409:
            assert_local(r, 409, "REQUEST_IN_PROGRESS", retry_after=True)
        else:
            assert r.json()["key"] == k and r.json()["n"] == 1, describe(r)


def test_an_unknown_outcome_repeated_with_another_payload_is_422(idem, upstream):
    """The key's first attempt timed out at Envoy (outcome unknown): the same request again is told
    so, and another request under that key is the reused-key answer, as for a completed key."""
    key = new_key()
    first = post(idem, "/t/timeouts", key, body={"sku": "A1", "qty": 1}, headers={"x-demo-delay-ms": "2500"})
    assert first.status == 504, describe(first)
    assert_outcome_unknown(post(idem, "/t/timeouts", key, body={"sku": "A1", "qty": 1}))
    assert_local(post(idem, "/t/timeouts", key, body={"sku": "A1", "qty": 9}), 422, "IDEMPOTENCY_KEY_REUSED")
    assert upstream.calls(key) == 1


CAS_POLICY = """
# One bucket for every key, on four workers: every claim and every completion rewrites the same
# shared-data value, so an update lost to a concurrent writer (a set without compare-and-swap)
# drops another request's claim.
[shared]
buckets = 1
entries_per_bucket = 64

[[route]]
name = "create-order"
match = { method = "POST", path = "/api/order/create" }
"""


def test_concurrent_writes_of_one_bucket_lose_no_claim(make_envoy, workdir):
    """wrk sends distinct keys on 32 connections for 3 s through four workers, all into one bucket
    (at most 32 claims in flight, within its 64 entries): every forwarded request's claim is still
    there when its answer is stored. A claim lost to a concurrent write of the bucket shows as a
    completion that finds no claim of its own (`lease_lost`) within the 30 s lease. A claim that
    gives up on the contention (a retryable 503) is allowed, rarely."""
    stack.require_wrk()
    try:
        fast = stack.start_fast_upstream(workdir)
    except stack.StackError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        env = make_envoy(CAS_POLICY, upstream_port=fast.listen_port, concurrency=4)
        res = stack.run_wrk(env.listen_port, CREATE, stack.WRK_SCRIPTS / "unique_keys.lua",
                            [CREATE, new_key("cas")], duration=3, connections=32, threads=2)
        wait_idle(env)
    finally:
        fast.stop()
    c = counters(env, "create-order")
    report = "wrk %s; counters %s" % (res, c)
    # A claim whose bounded CAS retries run out on a starved worker answers 503
    # IDEMPOTENCY_STORE_UNAVAILABLE (by design: the client retries; tests/store.rs): rare, and the
    # only answer that is not the service's. 1 in 8112 was seen once on a loaded 2-core run.
    errors = c.get("store_error", 0)
    assert res["requests"] >= 1000 and res["non_2xx"] == errors and errors * 1000 <= res["requests"], report
    assert c.get("lease_lost", 0) == 0, report
    # Every answered request was stored; the ones wrk cut off at its end are held as unknown.
    assert c.get("stored", 0) >= res["requests"], report
    assert c.get("stored", 0) + c.get("held", 0) == c.get("forwarded", 0), report
