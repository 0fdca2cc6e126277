"""Small assertion helpers shared by the e2e tests."""

import json
import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]00:00)$")


def post(env, path, key=None, body=None, headers=None, auth=None, timeout=10.0, key_header="Idempotency-Key",
         hold=None):
    h = {"content-type": "application/json"}
    if key is not None:
        h[key_header] = key
    if auth is not None:
        h["authorization"] = auth
    h.update(headers or {})
    if body is None:
        body = {"sku": "A1", "qty": 1}
    return env.request("POST", path, headers=h, body=body, timeout=timeout, hold=hold)


def describe(r):
    return "HTTP %d headers=%s body=%s" % (r.status, dict(r.headers), r.body[:400])


def assert_upstream_answer(r, key=None, n=None, status=200):
    """An answer produced by the demo upstream (not replayed, not a local reply)."""
    assert r.status == status, "expected the upstream's %d, got %s" % (status, describe(r))
    assert r.header("idempotent-replayed") is None, "fresh answer marked as replayed: %s" % describe(r)
    j = r.json()
    assert isinstance(j, dict) and "order_id" in j, "not an upstream answer: %s" % describe(r)
    if key is not None:
        assert j["key"] == key, describe(r)
    if n is not None:
        assert j["n"] == n, "expected upstream call #%d, got %s" % (n, describe(r))
    return j


def assert_replay_of(r, first):
    """`r` replays `first`: same status and byte-identical body, plus idempotent-replayed: true."""
    assert r.status == first.status, "replay status %d != first %d: %s" % (r.status, first.status, describe(r))
    assert r.header("idempotent-replayed") == "true", "no `idempotent-replayed: true`: %s" % describe(r)
    assert r.body == first.body, "replayed body differs:\n first: %r\nreplay: %r" % (first.body[:300], r.body[:300])


def assert_local(r, status, code, retry_after=False):
    """A local JSON answer of the filter with the given status and code."""
    assert r.status == status and r.code == code, \
        "expected %d %s, got %s" % (status, code, describe(r))
    j = r.json()
    assert isinstance(j.get("message"), str) and j["message"], "local answer without a message: %s" % describe(r)
    assert (r.header("content-type") or "").startswith("application/json"), describe(r)
    if retry_after:
        ra = r.header("retry-after")
        assert ra is not None and ra.strip().isdigit(), "409 without a numeric Retry-After: %s" % describe(r)
        # Short, never the lease end (SDKs that honour it would come back exactly then).
        assert ra.strip() == "1", "Retry-After must be short: %s" % describe(r)
    return j


def assert_outcome_unknown(r):
    """409 IDEMPOTENCY_OUTCOME_UNKNOWN: held, with nothing that invites a retry."""
    j = assert_local(r, 409, "IDEMPOTENCY_OUTCOME_UNKNOWN")
    assert r.header("retry-after") is None, "an unknown outcome must not invite a retry: %s" % describe(r)
    assert r.header("x-should-retry") == "false", describe(r)
    assert_first_seen_at(j, r)
    return j


def assert_first_seen_at(j, r=None):
    ts = j.get("first_seen_at")
    assert isinstance(ts, str) and RFC3339.match(ts), "first_seen_at is not RFC 3339 UTC: %r (%s)" % (
        ts, describe(r) if r else j)
    parsed = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    assert abs(parsed.timestamp() - time.time()) < 3600, "first_seen_at far from now: %s" % ts


def counters(env, route):
    prefix = "idem.%s." % route
    return {k[len(prefix):]: v for k, v in env.stats(prefix).items()}


def delta(before, after):
    keys = set(before) | set(after)
    return {k: after.get(k, 0) - before.get(k, 0) for k in keys if after.get(k, 0) != before.get(k, 0)}


def freeze(pid, timeout=5.0):
    """SIGSTOP a process and wait until every one of its threads is stopped: `kill` returns once
    the signal is pending (right after it, /proc showed Webdis not yet stopped in up to one try
    in five), and a test that freezes a component goes on only once it is frozen."""
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: all_threads_stopped(pid), timeout, interval=0.002, what="every thread of %d to stop" % pid)


def thaw(pid):
    os.kill(pid, signal.SIGCONT)


def all_threads_stopped(pid):
    """Every thread of `pid` in the stopped state (`T` in /proc/<pid>/task/<tid>/stat)."""
    states = []
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except OSError:  # a thread that just exited
            continue
    return bool(states) and all(s in ("T", "t") for s in states)


def wait_for(predicate, timeout, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    assert predicate(), "timed out after %.1fs waiting for %s" % (timeout, what)


def listener_stats(env):
    """Envoy's own stats of the HTTP listener (stat prefix `ingress`) without that prefix, e.g.
    {"downstream_rq_active": 0, "downstream_rq_total": 12, ...}."""
    prefix = "http.ingress."
    return {k[len(prefix):]: v for k, v in env.stats(prefix).items()}


def wait_idle(env, timeout=10.0):
    """Wait until Envoy is quiet: no client connection or request open (e.g. a wrk run's, after it
    ended) and no upstream request out on any cluster (forwarded requests, Redis store callouts)."""
    def idle():
        s = listener_stats(env)
        if s.get("downstream_cx_active", 0) or s.get("downstream_rq_active", 0):
            return False
        return not any(v for k, v in env.stats("cluster.").items() if k.endswith(".upstream_rq_active"))
    wait_for(idle, timeout, what="%s to have no client connection and no request open" % env.name)


def dumps(obj, **kw):
    return json.dumps(obj, **kw).encode()


def fire(n, fn, max_workers=None):
    """Run fn(i) for i in range(n) at once (a barrier releases them together); returns the results."""
    barrier = threading.Barrier(n)

    def one(i):
        barrier.wait(30)
        return fn(i)
    with ThreadPoolExecutor(max_workers=max_workers or n) as pool:
        return list(pool.map(one, range(n)))
