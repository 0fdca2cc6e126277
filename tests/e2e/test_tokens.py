"""Token mode against real Envoy, on both stores.

`shared`: one Envoy (its shared data is the store). `redis`: two Envoys sharing one Redis through
Webdis; tokens are issued on one and submitted (alternately) on both, so every check also proves
that a token lives in Redis, not in one process.
"""

import base64
import re
import time
import uuid
from collections import Counter

import pytest

import stack
from idemtest import (RFC3339, assert_first_seen_at, assert_local, assert_upstream_answer, counters, delta, describe,
                      fire, wait_for, wait_idle)

TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{32}$")
PREFIX = "idem-tok-%s:" % uuid.uuid4().hex[:6]


def token_policy(store, shared="", prefix=PREFIX):
    head = shared + (stack.redis_table(timeout="1s", prefix=prefix) if store == "redis" else "")
    return head + """
[[route]]
name = "form-a"
match = { method = "POST", path = "/tk/a" }
mode = "token"
store = "%(store)s"

[route.token]
issue_path = "/tk/token"
ttl = "10m"

[route.duplicate]
status = 409
code = "DUPLICATE_REQUEST"
message = "请勿重复提交"

[[route]]
name = "form-b"
match = { method = "POST", path = "/tk/b" }
mode = "token"
store = "%(store)s"

[route.token]
issue_path = "/tk/token"

[route.duplicate]
status = 409
code = "DUPLICATE_REQUEST"
message = "请勿重复提交"

[[route]]
name = "form-short"
match = { method = "POST", path = "/tk/short" }
mode = "token"
store = "%(store)s"

[route.token]
issue_path = "/tk/short-token"
ttl = "2s"

[route.duplicate]
status = 409
code = "DUPLICATE_REQUEST"
message = "请勿重复提交"

[[route]]
name = "form-slow"
match = { method = "POST", path = "/tk/slow" }
mode = "token"
store = "%(store)s"

[route.token]
issue_path = "/tk/slow-token"

[route.duplicate]
status = 409
code = "DUPLICATE_REQUEST"
message = "请勿重复提交"
""" % {"store": store}


# Envoy's routes, from the policy's (its forms and their token issue paths), and a catch-all with
# no filter. Envoy gives up on /tk/slow's upstream after 1 s (504): outcome unknown, the token
# stays used.
ROUTES = stack.routes_from_policy(
    token_policy("shared"),
    envoy={"form-slow": {"timeout": "1s"}},
    after=[{"name": "passthrough", "match": {"prefix": "/"}, "idem": False}],
)


@pytest.fixture(scope="module", params=["shared", "redis"])
def tk(request, workdir, upstream):
    """(store, [envoy for issuing, envoy for submitting]); for redis two Envoy processes."""
    store = request.param
    started = []
    rs = None
    try:
        if store == "shared":
            env = stack.start_idem_envoy(workdir, upstream.port, token_policy("shared"), routes=ROUTES)
            started.append(env)
            envs = [env, env]
        else:
            stack.require_redis()
            from conftest import RedisStack
            rs = RedisStack(workdir)
            envs = stack.start_fleet(workdir, upstream.port, rs.webdis.port, token_policy("redis"), routes=ROUTES)
            started.extend(envs)
    except stack.StackError as e:
        for env in started:
            env.stop()
        if rs:
            rs.stop()
        pytest.fail(str(e), pytrace=False)
    yield store, envs
    for env in started:
        env.stop()
    if rs:
        rs.stop()


@pytest.fixture(autouse=True)
def _tk_logs_on_failure(request):
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed and "tk" in request.fixturenames:
        for env in set(request.getfixturevalue("tk")[1]):
            print("\n--- Envoy log tail (%s) ---\n%s" % (env.config_path, env.log_tail(40)))


def issue(env, path="/tk/token?route=form-a", auth="Bearer alice"):
    h = {"authorization": auth} if auth else {}
    r = env.request("POST", path, headers=h, body=b"")
    assert r.status == 200 and r.code == "TOKEN_ISSUED", "issuing failed: %s" % describe(r)
    return r.json()["token"]


def submit(env, path, token, auth="Bearer alice", headers=None, timeout=10.0, key=None):
    """A form submission; `key` (sent as ?key=) lets the upstream count executions per submission."""
    h = {"content-type": "application/json"}
    if token is not None:
        h["Idempotency-Token"] = token
    if auth:
        h["authorization"] = auth
    h.update(headers or {})
    if key:
        path += "?key=" + key
    return env.request("POST", path, headers=h, body=b'{"title":"hello"}', timeout=timeout)


def assert_duplicate(r, used_before):
    j = assert_local(r, 409, "DUPLICATE_REQUEST")
    assert j["message"] == "请勿重复提交", describe(r)
    if used_before:
        assert_first_seen_at(j, r)
    else:
        assert "first_seen_at" not in j, "first_seen_at on a token that was never used: %s" % describe(r)


def new_sub():
    return "sub-%s" % uuid.uuid4().hex


# ------------------------------------------------------------------------------------ issuing

def test_issue_endpoint_is_answered_by_the_filter(tk, upstream):
    store, (ei, es) = tk
    calls_before = upstream.calls()["total"]
    before = counters(ei, "form-a")
    r = ei.request("POST", "/tk/token?route=form-a", headers={"authorization": "Bearer alice"}, body=b"")
    assert r.status == 200 and r.code == "TOKEN_ISSUED", describe(r)
    j = r.json()
    assert TOKEN_RE.match(j["token"]), "token is not 32 base64url chars: %r" % j["token"]
    assert len(base64.urlsafe_b64decode(j["token"])) == 24, "16 random bytes and an 8-byte tag"
    assert j["header"] == "Idempotency-Token" and j["ttl_seconds"] == 600, j
    assert RFC3339.match(j["expires_at"]) and j["expires_at"].endswith("Z"), j
    assert isinstance(j.get("message"), str) and j["message"], j
    assert "no-store" in (r.header("cache-control") or ""), describe(r)
    # A single token route on its issue path needs no ?route=.
    r2 = ei.request("POST", "/tk/short-token", headers={"authorization": "Bearer alice"}, body=b"")
    assert r2.status == 200 and r2.json()["ttl_seconds"] == 2, describe(r2)
    # Two token routes share /tk/token: the request must name one.
    assert_local(ei.request("POST", "/tk/token", headers={"authorization": "Bearer alice"}, body=b""), 400,
                 "IDEMPOTENCY_TOKEN_ROUTE_REQUIRED")
    # Not POST: 405 with Allow.
    for method in ("GET", "PUT", "DELETE"):
        g = ei.request(method, "/tk/token?route=form-a")
        assert_local(g, 405, "METHOD_NOT_ALLOWED")
        assert g.header("allow") == "POST", describe(g)
    # The upstream never saw any of these.
    assert upstream.calls()["total"] == calls_before, "the issue endpoint reached the upstream"
    got = delta(before, counters(ei, "form-a"))
    assert got.get("token_issued") == 1, got
    # Tokens are random: 20 issued tokens are distinct.
    assert len({issue(ei) for _ in range(20)}) == 20


def test_missing_token_header_is_400_and_not_forwarded(tk, upstream):
    store, (ei, es) = tk
    sub = new_sub()
    assert_local(submit(es, "/tk/a", None, key=sub), 400, "IDEMPOTENCY_TOKEN_MISSING")
    assert upstream.calls(sub) == 0


# ------------------------------------------------------------------------------------ single use

def test_every_fresh_token_is_accepted_once(tk, upstream):
    """20 fresh tokens, each submitted once (with a JSON body, like a form), then once more."""
    store, envs = tk
    wrong = []
    for i in range(20):
        token = issue(envs[i % 2])
        sub = new_sub()
        r = submit(envs[(i + 1) % 2], "/tk/a", token, key=sub)
        if r.status != 200:
            wrong.append(describe(r))
            continue
        assert_upstream_answer(r, key=sub, n=1)
        assert_duplicate(submit(envs[i % 2], "/tk/a", token, key=sub), used_before=True)
        assert upstream.calls(sub) == 1
    assert not wrong, "%d of 20 fresh tokens were refused on their first use, e.g. %s" % (len(wrong), wrong[0])


def test_50_concurrent_submissions_with_one_token_run_once(tk, upstream):
    store, envs = tk
    token = issue(envs[0])
    before = [counters(e, "form-a") for e in envs]
    sub = new_sub()
    answers = fire(50, lambda i: submit(envs[i % 2], "/tk/a", token, key=sub,
                                        headers={"x-demo-delay-ms": "300"}, timeout=30))
    kinds = Counter("%d %s" % (r.status, r.code or "upstream") for r in answers)
    fresh = [r for r in answers if r.status == 200]
    assert len(fresh) == 1, kinds
    assert_upstream_answer(fresh[0], key=sub, n=1)
    for r in answers:
        if r is not fresh[0]:
            assert_local(r, 409, "DUPLICATE_REQUEST")
            assert r.json()["message"] == "请勿重复提交"
    assert upstream.calls(sub) == 1
    got = [delta(b, counters(e, "form-a")) for b, e in zip(before, envs)]
    if envs[0] is envs[1]:
        got = got[:1]
    assert sum(g.get("token_consumed", 0) for g in got) == 1, got
    assert sum(g.get("token_rejected", 0) for g in got) == 49, got
    # And later: used -> the duplicate response with first_seen_at.
    assert_duplicate(submit(envs[1], "/tk/a", token, key=sub), used_before=True)
    assert upstream.calls(sub) == 1


def test_token_for_another_route_is_refused(tk, upstream):
    store, (ei, es) = tk
    token = issue(ei, "/tk/token?route=form-a")
    sub = new_sub()
    assert_local(submit(es, "/tk/b", token, key=sub), 400, "IDEMPOTENCY_TOKEN_INVALID")
    assert_local(submit(es, "/tk/short", token, key=sub), 400, "IDEMPOTENCY_TOKEN_INVALID")
    assert upstream.calls(sub) == 0
    # The refusal did not burn the token on its own route.
    assert_upstream_answer(submit(es, "/tk/a", token, key=sub), key=sub, n=1)
    # A token for form-b is refused on form-a.
    token_b = issue(ei, "/tk/token?route=form-b")
    sub_b = new_sub()
    assert_local(submit(es, "/tk/a", token_b, key=sub_b), 400, "IDEMPOTENCY_TOKEN_INVALID")
    assert_upstream_answer(submit(es, "/tk/b", token_b, key=sub_b), key=sub_b, n=1)


def test_token_issued_to_another_caller_is_refused(tk, upstream):
    store, (ei, es) = tk
    token = issue(ei, auth="Bearer alice")
    sub = new_sub()
    assert_duplicate(submit(es, "/tk/a", token, auth="Bearer bob", key=sub), used_before=False)
    assert_duplicate(submit(es, "/tk/a", token, auth=None, key=sub), used_before=False)
    assert upstream.calls(sub) == 0
    assert_upstream_answer(submit(es, "/tk/a", token, auth="Bearer alice", key=sub), key=sub, n=1)
    assert_duplicate(submit(ei, "/tk/a", token, auth="Bearer alice", key=sub), used_before=True)
    assert upstream.calls(sub) == 1


def test_a_token_the_gateway_never_issued_is_invalid_not_a_duplicate(tk, upstream):
    """Made up, mistyped, cut short, or another route's: 400 IDEMPOTENCY_TOKEN_INVALID — never the
    duplicate answer ("请勿重复提交") a used token gets. On Redis the token comes from the other
    Envoy, which shares the fleet's [tokens] secret."""
    store, (ei, es) = tk
    token = issue(ei)
    made_up = base64.urlsafe_b64encode(uuid.uuid4().bytes + uuid.uuid4().bytes[:8]).decode()
    typo = token[:-1] + ("A" if token[-1] != "A" else "B")
    other_route = issue(ei, "/tk/token?route=form-b")
    for fake, path in ((made_up, "/tk/a"), (typo, "/tk/a"), (token[:-4], "/tk/a"), (other_route, "/tk/a")):
        sub = new_sub()
        r = submit(es, path, fake, key=sub)
        j = assert_local(r, 400, "IDEMPOTENCY_TOKEN_INVALID")
        assert "no token this route issued" in j["message"], j
        assert upstream.calls(sub) == 0
    # The control: the real token passes on the other Envoy.
    sub = new_sub()
    assert_upstream_answer(submit(es, "/tk/a", token, key=sub), key=sub, n=1)


def test_expired_token_is_refused(tk, upstream):
    store, (ei, es) = tk
    token = issue(ei, "/tk/short-token")  # ttl = 2s
    time.sleep(2.6)  # a duration: past the 2 s ttl, the token expires by the clock
    sub = new_sub()
    assert_duplicate(submit(es, "/tk/short", token, key=sub), used_before=False)
    assert upstream.calls(sub) == 0
    # The control: a fresh token on the same route passes.
    fresh = issue(ei, "/tk/short-token")
    assert_upstream_answer(submit(es, "/tk/short", fresh, key=sub), key=sub, n=1)


# ------------------------------------------------------------------------------------ failures

def test_failed_submission_restores_the_token_and_the_retry_succeeds(tk, upstream):
    store, envs = tk
    ei, es = envs
    token = issue(ei)
    sub = new_sub()
    before = [counters(e, "form-a") for e in envs]
    r1 = submit(es, "/tk/a", token, key=sub, headers={"x-demo-status": "503"})
    assert r1.status == 503 and (r1.json() or {}).get("error"), "expected the upstream's 503: %s" % describe(r1)
    r2 = submit(ei, "/tk/a", token, key=sub)
    assert_upstream_answer(r2, key=sub, n=2)
    assert_duplicate(submit(es, "/tk/a", token, key=sub), used_before=True)
    assert upstream.calls(sub) == 2
    got = [delta(b, counters(e, "form-a")) for b, e in zip(before, envs)]
    if envs[0] is envs[1]:
        got = got[:1]
    assert sum(g.get("token_restored", 0) for g in got) == 1, got


def test_upstream_reset_does_not_restore_the_token(tk, upstream):
    store, (ei, es) = tk
    token = issue(ei)
    sub = new_sub()
    r1 = submit(es, "/tk/a", token, key=sub, headers={"x-demo-reset": "1"})
    assert r1.status >= 500 and r1.code is None and "order_id" not in (r1.json() or {}), describe(r1)
    assert upstream.calls(sub) == 1  # the work was done; the answer was lost
    assert_duplicate(submit(ei, "/tk/a", token, key=sub), used_before=True)
    assert upstream.calls(sub) == 1


def test_upstream_timeout_does_not_restore_the_token(tk, upstream):
    store, (ei, es) = tk
    token = issue(ei, "/tk/slow-token")
    sub = new_sub()
    r1 = submit(es, "/tk/slow", token, key=sub, headers={"x-demo-delay-ms": "2500"})
    assert r1.status == 504, describe(r1)
    assert_duplicate(submit(ei, "/tk/slow", token, key=sub), used_before=True)
    assert upstream.calls(sub) == 1


# ------------------------------------------------------------------------------------ hygiene

def test_tokens_are_never_logged_in_full(tk, upstream):
    store, envs = tk
    ei, es = envs
    tokens = []
    for i in range(10):
        t = issue(ei)
        tokens.append(t)
        sub = new_sub()
        # (Whether each is accepted is asserted elsewhere; here only what reaches the log matters.)
        submit(es, "/tk/a", t, key=sub)                                       # consumed
        assert_duplicate(submit(ei, "/tk/a", t, key=sub), used_before=True)   # logged rejection
        assert_local(submit(es, "/tk/b", t, key=sub), 400, "IDEMPOTENCY_TOKEN_INVALID")  # wrong route
    tokens.append(issue(ei, "/tk/short-token"))

    def all_logs():
        return "\n".join(e.log_text() for e in set(envs))
    # The last token's two rejections (used, wrong route) are the last lines the loop causes.
    wait_for(lambda: all_logs().count(tokens[9][:8] + "…") >= 2, 5, what="the last token's rejections in the log")
    logs = all_logs()
    leaked = [t for t in tokens if t in logs]
    assert not leaked, "tokens logged in full: %s" % leaked
    # The rejections are logged, with at most the first 8 characters of the token.
    shown = [t for t in tokens[:10] if (t[:8] + "…") in logs]
    assert shown, "no log line names a rejected token by its first 8 characters"
    for line in logs.splitlines():
        for t in tokens:
            assert t[:9] not in line, "more than 8 characters of a token in: %s" % line


def test_token_counters_are_exported(tk, upstream):
    """Each token outcome, caused here (not left to the module's other tests, whose order or
    selection would decide this one): issued, consumed after a 503 restored it, and rejected."""
    store, envs = tk
    ei, es = envs
    token, sub = issue(ei), new_sub()
    assert submit(es, "/tk/a", token, key=sub, headers={"x-demo-status": "503"}).status == 503  # restored
    assert submit(ei, "/tk/a", token, key=sub).status == 200  # consumed
    assert submit(es, "/tk/a", token, key=sub).status != 200  # rejected: used
    names = set()
    for e in set(envs):
        names |= set(e.stats("idem.form-a."))
    for n in ("token_issued", "token_consumed", "token_rejected", "token_restored"):
        assert "idem.form-a.%s" % n in names, "counter idem.form-a.%s missing: %s" % (n, sorted(names))


# ------------------------------------------------------------------------------------ memory

MEM_BUCKETS, MEM_ENTRIES, MEM_MAX_RESPONSE = 64, 8, 1024
MEM_SHARED = """
[shared]
buckets = %d
entries_per_bucket = %d
max_response_bytes = %d
""" % (MEM_BUCKETS, MEM_ENTRIES, MEM_MAX_RESPONSE)
# policies/README.md: memory <= buckets x entries x (56 + max_response_bytes + headers); see test_memory.py.
MEM_CAPACITY = MEM_BUCKETS * MEM_ENTRIES * (56 + MEM_MAX_RESPONSE + 1024)
MEM_SLACK_ALLOCATED = 4 << 20
MEM_SLACK_RSS = 16 << 20


@pytest.mark.parametrize("store", ["shared", "redis"])
def test_10k_issued_tokens_keep_memory_bounded(store, workdir, upstream, request):
    stack.require_wrk()
    started, rs = [], None
    try:
        if store == "shared":
            env = stack.start_idem_envoy(workdir, upstream.port, token_policy("shared", shared=MEM_SHARED),
                                         routes=ROUTES)
        else:
            stack.require_redis()
            from conftest import RedisStack
            rs = RedisStack(workdir)
            env = stack.start_fleet(workdir, upstream.port, rs.webdis.port,
                                    token_policy("redis", shared=MEM_SHARED), routes=ROUTES, n=1)[0]
        started.append(env)
    except stack.StackError as e:
        if rs:
            rs.stop()
        pytest.fail(str(e), pytrace=False)
    try:
        _issue_10k(env, rs, upstream)
    except BaseException:
        print("\n--- Envoy log tail (%s) ---\n%s" % (env.config_path, env.log_tail(30)))
        raise
    finally:
        env.stop()
        if rs:
            rs.stop()


def _issue_10k(env, rs, upstream):
    script = stack.WRK_SCRIPTS / "issue_token.lua"
    calls_before = upstream.calls()["total"]
    before = counters(env, "form-a")
    started = time.monotonic()
    sent = {"n": 0, "ok": 0, "runs": 0}

    def issue_until(target):
        while sent["n"] < target:
            assert time.monotonic() - started < 120, "only %d tokens issued in 120 s" % sent["n"]
            assert env.proc.alive(), "Envoy died:\n%s" % env.log_tail()
            res = stack.run_wrk(env.listen_port, "/tk/token", script, ["/tk/token?route=form-a", "Bearer wrk"],
                                duration=1, connections=8, threads=1)
            sent["runs"] += 1
            sent["n"] += res["requests"]
            sent["ok"] += res["requests"] - res["non_2xx"] - res["socket_errors"]

    def measure():
        wait_idle(env)  # measured with nothing in flight (wrk's last requests, store callouts)
        return env.memory()["allocated"], stack.rss_bytes(env.proc.pid)

    # Baseline: the VMs are warm (the fixture's requests, the stats reads) but no token is stored yet.
    env.request("GET", "/tk/token?route=form-a")
    alloc_0, rss_0 = measure()
    issue_until(10_000)
    alloc_10k, rss_10k = measure()
    got = delta(before, counters(env, "form-a"))
    report = ("tokens requested %d (2xx %d); allocated %d -> %d (+%d); RSS %d -> %d (+%d); capacity bound %d; "
              "counters %s" % (sent["n"], sent["ok"], alloc_0, alloc_10k, alloc_10k - alloc_0, rss_0, rss_10k,
                               rss_10k - rss_0, MEM_CAPACITY, got))
    print(report)
    assert sent["n"] >= 10_000
    # Every issue request was answered by the filter (none reached the upstream), and counted.
    assert upstream.calls()["total"] == calls_before, report
    # (wrk counts only the answers it read before its run ended; a few more may have been issued.)
    assert sent["ok"] <= got.get("token_issued", 0) <= sent["n"] + 8 * 100, report
    assert alloc_10k - alloc_0 <= MEM_CAPACITY + MEM_SLACK_ALLOCATED, "allocated memory grew: " + report
    assert rss_10k - rss_0 <= MEM_CAPACITY + MEM_SLACK_RSS, "RSS grew: " + report
    if rs is not None:
        # In Redis every token is one key with an expiry no longer than the route's ttl (10 min).
        keys = rs.keys(PREFIX + "t:*")
        # (Requests wrk abandoned at the end of a run may have stored a token nobody received: <= 8 per run.)
        runs = sent["runs"]
        assert got["token_issued"] <= len(keys) <= got["token_issued"] + 8 * runs, (
            "%d token keys in Redis for %d issued tokens (%d wrk runs)" % (len(keys), got["token_issued"], runs))
        sample = keys[:: max(1, len(keys) // 50)]
        pttls = [rs.redis.command("PTTL", k) for k in sample]
        assert all(0 < t <= 600_000 for t in pttls), pttls
    else:
        # The store never holds more than its capacity: most of the 10 000 were issued, and the
        # store still serves (a fresh token is issued and accepted once).
        assert sent["ok"] >= MEM_BUCKETS * MEM_ENTRIES, report
    token = issue(env)
    sub = new_sub()
    assert_upstream_answer(submit(env, "/tk/a", token, key=sub), key=sub, n=1)
    assert_duplicate(submit(env, "/tk/a", token, key=sub), used_before=True)
