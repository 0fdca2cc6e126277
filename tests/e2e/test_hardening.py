"""Hardening against real Envoy: no input kills a worker, leaks a response, merges two
transactions or bypasses a route; an answer in hand is never lost to a store hiccup.

Each test is one numbered case of the hardening issue (see the README's "Hardening" table).
"""

import base64
import contextlib
import hashlib
import hmac
import http.client
import json
import os
import random
import socket
import threading
import time
import uuid

import pytest

import stack
from conftest import new_key
from idemtest import (assert_local, assert_replay_of, assert_upstream_answer, counters, delta, describe, freeze, post,
                      thaw, wait_for)

PREFIX = "idem-hard-%s:" % uuid.uuid4().hex[:6]


def _policy(store="shared", lock_ttl="30s", timeout="500ms"):
    # Top-level keys come before the [redis] table (TOML would put them inside it).
    head = 'unmatched = "reject"\n' + (stack.redis_table(timeout=timeout, prefix=PREFIX) if store == "redis" else "")
    return head + """
[[route]]
name = "h-key"
match = {{ method = "POST", path = "/h/key" }}
store = "{store}"

[route.key]
lock_ttl = "{lock_ttl}"

[[route]]
name = "h-cookie"
match = {{ method = "POST", path = "/h/cookie" }}
store = "{store}"

[route.key]
scope = ["cookie:session"]

[[route]]
name = "h-anon"
match = {{ method = "POST", path = "/h/anon" }}
store = "{store}"

[route.key]
anonymous = "shared"

[[route]]
name = "h-jwt"
match = {{ method = "POST", path = "/h/jwt" }}
store = "{store}"

[route.key]
scope = ["metadata:envoy.filters.http.jwt_authn/jwt_payload/sub"]

[[route]]
name = "h-callback"
match = {{ method = "POST", path = "/h/callback" }}
store = "{store}"

[route.key]
from = "body"
name = "/transaction_id"
scope = []
fingerprint = []

[[route]]
name = "h-order-create"
match = {{ method = "POST", path = "/h/order/create" }}
store = "{store}"
""".format(store=store, lock_ttl=lock_ttl)


def policy(store="shared", lock_ttl="30s", timeout="500ms"):
    """The hardening routes; on the native build without h-jwt, whose scope nested in metadata it
    refuses at load (test_native.py), so the other routes still run there."""
    text = _policy(store, lock_ttl, timeout)
    if stack.ARTIFACT == "native":
        start = text.index('[[route]]\nname = "h-jwt"')
        text = text[:start] + text[text.index("[[route]]", start + 1):]
    return text


# Envoy's routes, from the policy's, and a catch-all with no filter. /h/order/create is reached
# case-insensitively through its prefix: aliases of /h/order/create (/Create, /create/) reach the
# filter, as they reach a framework that routes them to one handler.
ROUTES = stack.routes_from_policy(
    policy(),
    envoy={"h-order-create": {"match": {"prefix": "/h/order/", "case_sensitive": False}}},
    after=[{"name": "passthrough", "match": {"prefix": "/"}, "idem": False}],
)


JWT_SECRET = b"idem-e2e-jwt-secret-0123456789abcdef"


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt(sub, iat):
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "k1"}).encode())
    payload = b64url(json.dumps({"iss": "idem-e2e", "sub": sub, "iat": iat, "exp": iat + 3600}).encode())
    sig = hmac.new(JWT_SECRET, ("%s.%s" % (header, payload)).encode(), hashlib.sha256).digest()
    return "%s.%s.%s" % (header, payload, b64url(sig))


JWT_AUTHN = {
    "name": "envoy.filters.http.jwt_authn",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
        "providers": {"e2e": {
            "issuer": "idem-e2e",
            "local_jwks": {"inline_string": json.dumps(
                {"keys": [{"kty": "oct", "alg": "HS256", "kid": "k1", "k": b64url(JWT_SECRET)}]})},
            "payload_in_metadata": "jwt_payload",
        }},
        "rules": [{"match": {"prefix": "/h/jwt"}, "requires": {"provider_name": "e2e"}}],
    },
}


@pytest.fixture(params=["shared", "redis"])
def gateway(request, module_gateway):
    """One Envoy with one worker per store, kept for the module's tests (so one crash would show on
    every later request, of this test and the next ones); every test uses its own keys."""
    return module_gateway(request.param, policy(request.param), ROUTES, concurrency=1, pre_filters=[JWT_AUTHN])


def raw_post(env, path, headers, body=b'{"sku":"A1"}', timeout=10.0):
    """A POST whose header values are bytes, sent as they are (non-UTF-8 included)."""
    conn = http.client.HTTPConnection("127.0.0.1", env.listen_port, timeout=timeout)
    try:
        conn.putrequest("POST", path, skip_accept_encoding=True)
        for name, value in headers:
            conn.putheader(name, value)
        conn.putheader("content-type", "application/json")
        conn.putheader("content-length", str(len(body)))
        conn.endheaders(body)
        r = conn.getresponse()
        return stack.Response(r.status, [(k.lower(), v) for k, v in r.getheaders()], r.read())
    finally:
        conn.close()


def assert_worker_alive(env):
    key = new_key("alive")
    r = post(env, "/h/key", key)
    assert_upstream_answer(r, key=key, n=1)
    log = env.log_text()
    assert "panic" not in log and "unreachable" not in log, "the VM trapped:\n%s" % env.log_tail(40)


# ---------------------------------------------------------------- 1. one byte must not kill a worker

def test_non_utf8_key_and_scope_are_400_and_the_worker_lives(gateway):
    r = raw_post(gateway, "/h/key", [("Idempotency-Key", b"caf\xe9-1"), ("authorization", b"Bearer a")])
    assert_local(r, 400, "IDEMPOTENCY_KEY_INVALID")
    assert "UTF-8" in r.json()["message"], describe(r)
    r = raw_post(gateway, "/h/key", [("Idempotency-Key", b"k-1"), ("authorization", b"Bearer \xe9\xff")])
    assert_local(r, 400, "IDEMPOTENCY_KEY_INVALID")
    assert_worker_alive(gateway)


def test_latin1_response_header_is_stored_and_replayed_as_bytes(gateway, upstream):
    key = new_key("latin1")
    first = post(gateway, "/h/key", key, headers={"x-demo-latin1": "1"})
    want = 'attachment; filename="r\xe9sum\xe9.pdf"'  # http.client reads header bytes as Latin-1
    assert_upstream_answer(first, key=key, n=1)
    assert first.header("content-disposition") == want, describe(first)
    again = post(gateway, "/h/key", key, headers={"x-demo-latin1": "1"})
    assert_replay_of(again, first)
    assert again.header("content-disposition") == want, describe(again)
    assert upstream.calls(key=key) == 1
    assert_worker_alive(gateway)


def test_arbitrary_header_bytes_never_trap_the_vm(gateway):
    """A sweep of random bytes in the key, the scope and another header: every answer is a
    decision (forwarded, 400, 409), never the 503 of a trapped VM."""
    rng = random.Random(9)
    statuses = {}
    for i in range(120):
        junk = bytes(rng.choice([rng.randrange(0x20, 0x7f), rng.randrange(0x80, 0x100)]) for _ in range(rng.randrange(1, 24)))
        junk = junk.replace(b"\r", b"x").replace(b"\n", b"x")
        where = i % 3
        headers = [("Idempotency-Key", junk if where == 0 else ("k-%d-%s" % (i, uuid.uuid4().hex)).encode()),
                   ("authorization", junk if where == 1 else b"Bearer sweep"),
                   ("x-junk", junk if where == 2 else b"ok")]
        r = raw_post(gateway, "/h/key", headers)
        statuses[r.status] = statuses.get(r.status, 0) + 1
        assert r.status in (200, 400, 409), "input %r in header %d: %s" % (junk, where, describe(r))
    assert statuses.get(200) and statuses.get(400), statuses
    assert_worker_alive(gateway)


# ---------------------------------------------------------------- 2. no scope collapses into "everyone"

def test_callers_without_the_scope_header_are_refused_not_merged(gateway, upstream):
    key = new_key("anon")
    for cookie in ("session=alice", "session=bob"):
        r = gateway.request("POST", "/h/key", headers={"Idempotency-Key": key, "cookie": cookie},
                            body={"sku": "A1"}, anonymous=True)
        j = assert_local(r, 400, "IDEMPOTENCY_SCOPE_MISSING")
        assert "authorization" in j["message"], describe(r)
    assert upstream.calls(key=key) == 0


def test_cookie_scope_keeps_session_users_apart(gateway, upstream):
    key = new_key("cookie")
    alice = gateway.request("POST", "/h/cookie", headers={"Idempotency-Key": key, "cookie": "session=alice"},
                            body={"sku": "A1"}, anonymous=True)
    bob = gateway.request("POST", "/h/cookie", headers={"Idempotency-Key": key, "cookie": "theme=x; session=bob"},
                          body={"sku": "A1"}, anonymous=True)
    assert_upstream_answer(alice, key=key, n=1)
    assert_upstream_answer(bob, key=key, n=2)
    again = gateway.request("POST", "/h/cookie", headers={"Idempotency-Key": key, "cookie": "session=alice"},
                            body={"sku": "A1"}, anonymous=True)
    assert_replay_of(again, alice)


def test_anonymous_shared_is_an_explicit_choice(gateway, upstream):
    key = new_key("shared-anon")
    first = gateway.request("POST", "/h/anon", headers={"Idempotency-Key": key}, body={"sku": "A1"}, anonymous=True)
    assert_upstream_answer(first, key=key, n=1)
    other = gateway.request("POST", "/h/anon", headers={"Idempotency-Key": key}, body={"sku": "A1"}, anonymous=True)
    assert_replay_of(other, first)
    # An identified caller is never in the anonymous scope.
    named = post(gateway, "/h/anon", key, auth="Bearer carol")
    assert_upstream_answer(named, key=key, n=2)


@pytest.mark.wasm_only("a scope nested in metadata (metadata:…/jwt_payload/sub)")
def test_jwt_subject_scope_survives_a_token_refresh(gateway, upstream):
    key = new_key("jwt")
    now = int(time.time())
    first = post(gateway, "/h/jwt", key, auth="Bearer " + jwt("user-1", now - 10))
    assert_upstream_answer(first, key=key, n=1)
    # The client refreshed its token (another Authorization value, same subject): still a replay.
    refreshed = post(gateway, "/h/jwt", key, auth="Bearer " + jwt("user-1", now))
    assert_replay_of(refreshed, first)
    # Another subject with the same key is another caller.
    other = post(gateway, "/h/jwt", key, auth="Bearer " + jwt("user-2", now))
    assert_upstream_answer(other, key=key, n=2)


# ---------------------------------------------------------------- 3. two numeric ids stay two keys

def test_big_numeric_ids_stay_distinct_and_equal_numbers_are_one_key(gateway, upstream):
    base = random.randrange(10 ** 19, 9 * 10 ** 19)
    a, b = base * 10 + 1, base * 10 + 2  # 20+ digits; one f64 cannot tell them apart
    for txn in (a, b):
        r = gateway.request("POST", "/h/callback", body=('{"transaction_id": %d, "amount": 1}' % txn).encode(),
                            headers={"content-type": "application/json"})
        assert r.status == 200 and r.header("idempotent-replayed") is None, "txn %d: %s" % (txn, describe(r))
        assert upstream.calls(transaction_id=str(txn)) == 1
    n = random.randrange(1000, 9000)
    first = gateway.request("POST", "/h/callback", body=('{"transaction_id": %d}' % n).encode(),
                            headers={"content-type": "application/json"})
    assert first.status == 200 and first.header("idempotent-replayed") is None, describe(first)
    for same in ("%d.0" % n, "%de0" % n, "%d0e-1" % n):
        r = gateway.request("POST", "/h/callback", body=('{"transaction_id": %s}' % same).encode(),
                            headers={"content-type": "application/json"})
        assert_replay_of(r, first)


# ---------------------------------------------------------------- 6. trailers: never a truncated replay

def test_answer_with_trailers_is_never_replayed_truncated(gateway, upstream):
    key = new_key("trailers")
    first = post(gateway, "/h/key", key, headers={"x-demo-trailers": "1"})
    assert_upstream_answer(first, key=key, n=1)
    again = post(gateway, "/h/key", key, headers={"x-demo-trailers": "1"})
    assert_local(again, 409, "DUPLICATE_REQUEST")
    assert upstream.calls(key=key) == 1


# ---------------------------------------------------------------- 7. path aliases, unmatched routes

def test_path_aliases_share_the_policy_and_unmatched_writes_fail_closed(gateway, upstream):
    key = new_key("alias")
    first = post(gateway, "/h/order/create", key)
    assert_upstream_answer(first, key=key, n=1)
    for alias in ("/h/order/create/", "/h/order/Create", "/h//order/create", "/h/order/%63reate",
                  "/h/order/x/../create"):
        r = post(gateway, alias, key)
        assert_replay_of(r, first)
    assert upstream.calls(key=key) == 1
    # A filter-enabled route where no policy matches a write: refused (unmatched = "reject").
    before = gateway.stats("idem._unmatched.")
    r = post(gateway, "/h/order/cancel", new_key("unmatched"))
    assert_local(r, 400, "IDEMPOTENCY_NO_POLICY")
    # Reads pass.
    r = gateway.request("GET", "/h/order/cancel")
    assert r.status == 200, describe(r)
    # Counted: the POST above (rejected) and the GET (passed), nothing else meanwhile.
    counted = delta(before, gateway.stats("idem._unmatched."))
    assert counted == {"idem._unmatched.rejected": 1, "idem._unmatched.passed": 1}, counted


# ---------------------------------------------------------------- 8. the key header twice

def test_two_key_headers_are_ambiguous(gateway, upstream):
    key = new_key("twice")
    r = raw_post(gateway, "/h/key", [("Idempotency-Key", key.encode()), ("Idempotency-Key", b"other"),
                                     ("authorization", b"Bearer a")])
    j = assert_local(r, 400, "IDEMPOTENCY_KEY_INVALID")
    assert "2 times" in j["message"], describe(r)
    r = raw_post(gateway, "/h/key", [("Idempotency-Key", b"a, b"), ("authorization", b"Bearer a")])
    assert_local(r, 400, "IDEMPOTENCY_KEY_INVALID")
    assert upstream.calls(key=key) == 0


# ---------------------------------------------------------------- 4, 5, 9. the Redis store's hiccups

@pytest.fixture
def redis_gateway(own_redis_stack, make_fleet):
    env = make_fleet(policy("redis", lock_ttl="1s"), ROUTES, own_redis_stack.webdis.port, n=1, concurrency=2)[0]
    return own_redis_stack, env


def in_thread(fn):
    box = {}
    t = threading.Thread(target=lambda: box.update(r=fn()))
    t.start()
    return t, box


def retry_until_answered(env, key, deadline_s=15.0):
    """A client retrying the same request: returns every answer until one is not 409/503."""
    seen = []
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        r = post(env, "/h/key", key, timeout=5)
        seen.append((r.status, r.code))
        if r.status not in (409, 503):
            return r, seen
        time.sleep(0.3)  # the retrying client's pace
    raise AssertionError("no final answer in %.0fs: %s" % (deadline_s, seen))


def test_a_completion_redis_refuses_is_retried_not_lost(redis_gateway, upstream):
    rs, env = redis_gateway
    key = new_key("oom")
    t, box = in_thread(lambda: post(env, "/h/key", key, headers={"x-demo-delay-ms": "1500"}))
    wait_for(lambda: upstream.calls(key=key) == 1, 10, what="the first request to reach the upstream")
    rs.redis.command("CONFIG", "SET", "maxmemory", "1")  # every write refused: OOM
    try:
        t.join(15)
        first = box["r"]
        assert_upstream_answer(first, key=key, n=1)
        # Redis still refuses: the retry is told to wait, not let through.
        r = post(env, "/h/key", key)
        assert_local(r, 409, "REQUEST_IN_PROGRESS", retry_after=True)
        time.sleep(1.5)  # a duration: past the 1 s lease, which ends by the clock
        r = post(env, "/h/key", key)
        assert_local(r, 409, "REQUEST_IN_PROGRESS", retry_after=True)
    finally:
        rs.redis.command("CONFIG", "SET", "maxmemory", "0")
    final, seen = retry_until_answered(env, key)
    assert_replay_of(final, first)
    assert upstream.calls(key=key) == 1, seen
    c = counters(env, "h-key")
    # Retried as often as Redis refused it (that depends on the backoff's timing); stored once.
    assert c.get("write_retried", 0) >= 1 and c.get("stored", 0) == 1, c


def test_webdis_stopped_during_the_upstream_call_loses_nothing(redis_gateway, upstream):
    rs, env = redis_gateway
    key = new_key("sigstop")
    t, box = in_thread(lambda: post(env, "/h/key", key, headers={"x-demo-delay-ms": "1500"}))
    wait_for(lambda: upstream.calls(key=key) == 1, 10, what="the first request to reach the upstream")
    freeze(rs.webdis.proc.pid)
    try:
        t.join(15)
        first = box["r"]
        assert_upstream_answer(first, key=key, n=1)
        time.sleep(1.5)  # a duration: the 1 s lease ends (by the clock) while Webdis is stopped
        r = post(env, "/h/key", key)
        # This Envoy knows its answer is not written yet: in progress, without asking Redis.
        assert_local(r, 409, "REQUEST_IN_PROGRESS", retry_after=True)
    finally:
        thaw(rs.webdis.proc.pid)
    final, seen = retry_until_answered(env, key)
    assert_replay_of(final, first)
    assert upstream.calls(key=key) == 1, seen


def test_an_answer_whose_claim_expired_unclaimed_meanwhile_is_still_stored(redis_gateway, upstream):
    rs, env = redis_gateway
    key = new_key("outlived")
    t, box = in_thread(lambda: post(env, "/h/key", key, headers={"x-demo-delay-ms": "1500"}))
    wait_for(lambda: upstream.calls(key=key) == 1, 10, what="the first request to reach the upstream")
    # The claim's record goes as if its lease had run out with nobody taking the key over (the
    # gateway renews leases while it lives, so only a deletion makes this happen on time).
    claims = rs.keys(PREFIX + "k:*")
    assert len(claims) == 1, claims
    assert rs.redis.command("DEL", claims[0]) == 1
    t.join(15)
    first = box["r"]
    assert_upstream_answer(first, key=key, n=1)
    again = post(env, "/h/key", key)
    assert_replay_of(again, first)
    assert upstream.calls(key=key) == 1


@pytest.fixture
def redis_gateway_30s_lease(own_redis_stack, make_fleet):
    """As redis_gateway, with the default 30 s lease: long enough that its expiry frees nothing
    within a test's wait."""
    env = make_fleet(policy("redis", lock_ttl="30s"), ROUTES, own_redis_stack.webdis.port, n=1, concurrency=2)[0]
    return own_redis_stack, env


def redis_calls(rs, command):
    """How often Redis ran a command (INFO commandstats)."""
    info = rs.redis.command("INFO", "commandstats").decode()
    for line in info.splitlines():
        if line.startswith("cmdstat_%s:" % command):
            return int(line.split("calls=", 1)[1].split(",", 1)[0])
    return 0


@pytest.fixture
def redis_gateway_one_worker(own_redis_stack, make_fleet):
    """One worker (so every claim is this worker's group commit), a 30 s lease and a 10 s callout
    timeout: claim calls stay out long enough for a claim to queue behind them, even on a loaded
    machine."""
    env = make_fleet(policy("redis", lock_ttl="30s", timeout="10s"), ROUTES, own_redis_stack.webdis.port, n=1,
                     concurrency=1)[0]
    return own_redis_stack, env


def webdis_calls_out(env):
    """Callouts to Webdis Envoy has open now: the Webdis cluster's active requests, and those
    still waiting for a connection (with Webdis stopped, a second call's connection may still be
    being set up on a loaded machine; the filter has sent it all the same)."""
    stats = env.stats("cluster.webdis.upstream_rq_")
    return stats.get("cluster.webdis.upstream_rq_active", 0) + stats.get("cluster.webdis.upstream_rq_pending_active", 0)


def upstream_rq_total(env):
    """Requests Envoy's listener has taken in (its HTTP connection manager's count)."""
    return sum(v for k, v in env.stats("http.").items()
               if k.endswith(".downstream_rq_total") and not k.startswith("http.admin."))


def wait_until_webdis_is_quiet(env, quiet_s=2.0, deadline_s=20.0):
    """Every root's eviction probe (each one's first Webdis call) answered, and no Webdis call out
    for `quiet_s`: a worker whose VM starts later than the first root's sends its probe late, and a
    probe sent once a test has stopped Webdis would count as one of its calls. The native build
    makes a worker's root at its first request: one is always sent to start it (the log does not
    tell whether it exists: a root made when a config loads can log its probe's answer first)."""
    if stack.ARTIFACT == "native":
        post(env, "/h/key", new_key("start-root"))
    wait_for(lambda: "maxmemory-policy" in env.log_text(), deadline_s, what="a first eviction probe's answer")
    end = time.monotonic() + deadline_s
    quiet_since = None
    while time.monotonic() < end:
        if webdis_calls_out(env) == 0:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= quiet_s:
                return
        else:
            quiet_since = None
        time.sleep(0.1)
    raise AssertionError("Webdis calls stayed out for %.0f s after the probes" % deadline_s)


def test_a_client_that_leaves_while_its_claim_waits_in_a_batch_leaves_no_claim_behind(redis_gateway_one_worker,
                                                                                       upstream):
    """Group commit: with four claim calls out (Webdis stopped), a fifth request's claim waits for
    the next batch; its client leaves meanwhile. The waiting claim is dropped, never sent: when
    Webdis resumes Redis sees exactly the four claims that were out, and the client's retry runs
    at once — not 409 for the 30 s lease of a claim nobody holds."""
    rs, env = redis_gateway_one_worker
    # Every root's eviction probe (each one's first Webdis call) is answered before Webdis stops:
    # no call is out.
    wait_until_webdis_is_quiet(env)
    before = upstream_rq_total(env)
    busy = [new_key("busy-%d" % i) for i in range(4)]
    key = new_key("left")
    sets_before = redis_calls(rs, "set")
    freeze(rs.webdis.proc.pid)
    threads = []
    try:
        for k in busy:
            # Held at the upstream 3 s once claimed, so their completions come after the count below.
            threads.append(in_thread(lambda k=k: post(env, "/h/key", k, headers={"x-demo-delay-ms": "3000"},
                                                      timeout=30)))
        # The four claim calls are out (Webdis reads nothing while stopped): Envoy says so.
        wait_for(lambda: webdis_calls_out(env) == 4, 8, what="the four claim calls to be out")
        body = b'{"sku":"L1"}'
        with socket.create_connection(("127.0.0.1", env.listen_port), timeout=5) as c:
            c.sendall(b"POST /h/key HTTP/1.1\r\nhost: gw\r\nidempotency-key: " + key.encode()
                      + b"\r\nauthorization: " + stack.DEFAULT_AUTH.encode()
                      + b"\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
            wait_for(lambda: upstream_rq_total(env) >= before + 5, 10, what="the fifth request to reach Envoy")
            time.sleep(0.3)
            # Its claim waits for the next batch: still four calls out, none for it.
            assert webdis_calls_out(env) == 4, "a fifth claim call went out while four were"
        time.sleep(0.3)  # the client has left
    finally:
        thaw(rs.webdis.proc.pid)
    # Webdis, resumed, runs what it had read: the four claims, and nothing for the fifth (its
    # claim would go as the four come back, long before their completions).
    wait_for(lambda: redis_calls(rs, "set") >= sets_before + 4, 5, what="the four claims to reach Redis")
    time.sleep(0.7)
    assert redis_calls(rs, "set") == sets_before + 4, "the claim of the client that left was sent"
    for t, box in threads:
        t.join(15)
        assert box["r"].status == 200, describe(box["r"])
    resumed = time.monotonic()
    final, seen = retry_until_answered(env, key, deadline_s=5)
    assert time.monotonic() - resumed < 4, seen
    assert final.status == 200 and final.header("idempotent-replayed") is None, describe(final)
    assert upstream.calls(key=key) == 1, seen


@contextlib.contextmanager
def explained(env, seen, rs, upstream, key):
    """A wait that times out says what it saw meanwhile, idem's and the Webdis cluster's stats,
    whether Webdis is stopped, what Redis holds and whether the request reached the upstream.
    The claim-left test failed about once in 15 runs beside test_redis.py under -n 2, at either
    wait, once with one more request forwarded and stored than it sent before stopping Webdis:
    replies that Webdis wrote into Envoy's connection for commands of connections that had closed
    (docs/redis.md), read as this test's calls' replies; replies are now read only under their
    call's tag."""
    try:
        yield
    except AssertionError as e:
        stats = {k: v for k, v in env.stats("").items() if v and k.startswith(("idem", "cluster.webdis.upstream_"))}
        try:
            state = open("/proc/%d/stat" % rs.webdis.proc.pid).read().rsplit(")", 1)[1].split()[0]
        except OSError as gone:
            state = "gone (%s)" % gone
        raise AssertionError("%s; seen: %s; non-zero idem and Webdis stats: %s; Webdis state %s; Redis keys %s; "
                             "upstream calls of the key %s; log: %s"
                             % (e, sorted(set(seen)), stats, state, rs.keys("*"), upstream.calls(key=key),
                                env.log_tail(12))) from None


def test_a_claim_answered_after_its_client_left_is_expected_not_a_stray_reply(redis_gateway_one_worker, upstream):
    """Envoy 1.40 keeps a stream's callout on the worker's root context: a claim whose client
    left is still out, and still answered, after its request ended. That reply is expected — not
    counted in idem_stray_replies_total — and the claim is released (owner-checked), so the
    client's retry runs at once, and once."""
    rs, env = redis_gateway_one_worker
    wait_until_webdis_is_quiet(env)
    stray_before = env.counter("idem_stray_replies_total")
    key = new_key("left-claim")
    before = upstream_rq_total(env)
    freeze(rs.webdis.proc.pid)
    try:
        body = json.dumps({"sku": "A1", "qty": 1}).encode()  # the request its retry sends again
        with socket.create_connection(("127.0.0.1", env.listen_port), timeout=5) as c:
            c.sendall(b"POST /h/key HTTP/1.1\r\nhost: gw\r\nidempotency-key: " + key.encode()
                      + b"\r\nauthorization: " + stack.DEFAULT_AUTH.encode()
                      + b"\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
            seen = []
            with explained(env, seen, rs, upstream, key):
                wait_for(lambda: seen.append((upstream_rq_total(env) - before, webdis_calls_out(env)))
                         or seen[-1] == (1, 1), 8, what="its claim call to be out (requests in, Webdis calls out)")
        # The client has left; Envoy ends its request (the stream's context goes) but not the call.
        wait_for(lambda: sum(v for k, v in env.stats("http.").items() if k.endswith(".downstream_cx_active")
                             and not k.startswith("http.admin.")) == 0, 5, what="the client's connection to close")
        # Out: the claim, and the orphan release its request's end queued (were the claim
        # cancelled with its stream, only the release would be).
        seen = []
        with explained(env, seen, rs, upstream, key):
            wait_for(lambda: seen.append(webdis_calls_out(env)) or seen[-1] == 2, 5,
                     what="the claim call and the orphan release to be out")
        time.sleep(0.3)
        assert webdis_calls_out(env) == 2, "the claim call ended with its stream"
    finally:
        thaw(rs.webdis.proc.pid)
    wait_for(lambda: webdis_calls_out(env) == 0, 5, what="the claim's answer and the release")
    final, seen = retry_until_answered(env, key, deadline_s=5)
    assert_upstream_answer(final, key=key, n=1)
    assert upstream.calls(key=key) == 1, seen
    assert env.counter("idem_stray_replies_total") == stray_before, env.log_tail(20)


def test_a_claim_that_lands_after_its_callout_timed_out_is_released(redis_gateway_30s_lease, upstream):
    rs, env = redis_gateway_30s_lease
    key = new_key("orphan")
    sets_before = redis_calls(rs, "set")
    freeze(rs.webdis.proc.pid)
    try:
        r = post(env, "/h/key", key)  # the claim callout times out after 500 ms: Envoy answers it 504
        assert_local(r, 503, "IDEMPOTENCY_STORE_UNAVAILABLE")
    finally:
        thaw(rs.webdis.proc.pid)
    resumed = time.monotonic()
    # Webdis, resumed, still runs the SET it had read: a claim nobody owns lands in Redis.
    wait_for(lambda: redis_calls(rs, "set") > sets_before, 5, what="the timed-out SET to reach Redis")
    # The gateway frees it within about a second, long before its 30 s lease would.
    final, seen = retry_until_answered(env, key, deadline_s=5)
    assert time.monotonic() - resumed < 4, seen
    assert_upstream_answer(final, key=key, n=1)
    assert upstream.calls(key=key) == 1, seen
