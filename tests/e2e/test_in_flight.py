"""Requests whose body is still arriving when the gateway decides (issue 36), with real clients.

- A stream decided from the root (a held duplicate that takes the key over, a claim queued by
  Redis group commit) goes on with the rest of its body: forwarded whole, answered, and its key
  replayed afterwards — never a hang followed by a day of OUTCOME_UNKNOWN.
- A route deciding at the headers never holds the body against Envoy's buffer limit: 2 MiB
  bodies reach the upstream on Redis (they got Envoy's own 413 while the Webdis call was out).
- An answer decided before the body has arrived (replay, 409, 409 in progress, 422, 400, 413) is read by curl
  (HTTP/2 and HTTP/1.1), httpx over HTTP/2 and Node's http2 client while they upload 2 MiB: the
  gateway reads the rest of the body and drops it, then answers (Envoy's early answer ends an
  HTTP/2 stream with RST_STREAM, which curl 7.88 reports as error 92 and httpx as a failure).
  On Redis a 409 REQUEST_IN_PROGRESS is decided by a Webdis call while the body arrives; chunks
  held meanwhile past Envoy's buffer stop its reading, and the answer waited its full 10 s
  before going (curl without `Expect: 100-continue`): it now waits 200 ms at most for a chunk.
"""

import json
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import stack
from idemtest import describe, post

SDK = Path(__file__).resolve().parent / "sdk"
MIB2 = 2 << 20
AUTH = stack.DEFAULT_AUTH


def policy(store, prefix):
    head = stack.redis_table(timeout="2s", prefix=prefix) if store == "redis" else ""
    routes = """
[[route]]
name = "early"
match = { method = "POST", path = "/e/early" }
store = "%(store)s"

[route.key]
fingerprint = ["method", "path", "header:x-variant"]

[[route]]
name = "early-reject"
match = { method = "POST", path = "/e/reject" }
store = "%(store)s"

[route.key]
fingerprint = ["method", "path"]
on_completed = "reject"

[[route]]
name = "early-small"
match = { method = "POST", path = "/e/small" }
store = "%(store)s"
max_body_bytes = 1024

[[route]]
name = "early-wait"
match = { method = "POST", path = "/e/wait" }
store = "%(store)s"

[route.key]
fingerprint = ["method", "path"]
lock_ttl = "30s"
on_in_flight = "wait"
wait_timeout = "15s"
""" % {"store": store}
    return head + routes


# A first request on /e/reject stays in flight for the whole module (the 409 REQUEST_IN_PROGRESS
# case below): the route's timeout outlasts it.
ROUTES = stack.routes_from_policy(policy("shared", ""), envoy={"early-reject": {"timeout": "600s"}},
                                  after=[{"name": "passthrough", "match": {"prefix": "/"}, "idem": False}])


@pytest.fixture(scope="module", params=["shared", "redis"])
def gateway(request, workdir, upstream):
    """One Envoy per store for the module (one worker, so group commit batches on Redis)."""
    store = request.param
    prefix = "idem-flight-%s:" % uuid.uuid4().hex[:6]
    if store == "shared":
        env = stack.start_idem_envoy(workdir, upstream.port, policy(store, prefix), routes=ROUTES, concurrency=1)
        yield env
        env.stop()
        return
    request.getfixturevalue("redis_components")
    rs = request.getfixturevalue("redis_stack")
    env = stack.start_fleet(workdir, upstream.port, rs.webdis.port, policy(store, prefix), routes=ROUTES, n=1,
                            concurrency=1)[0]
    yield env
    env.stop()


def url(env, path):
    return "http://127.0.0.1:%d%s" % (env.listen_port, path)


def slow_body(first, rest, pause):
    """A body sent in two parts with a pause between: the second arrives `pause` s after the headers."""
    def gen():
        yield first
        time.sleep(pause)
        yield rest
    return gen()


def slow_post(env, path, key, size=8192, pause=0.5, headers=None, timeout=20.0):
    """httpx (HTTP/1.1) POSTs `size` bytes whose second half arrives `pause` s after the headers."""
    body = b"x" * size
    h = {"authorization": AUTH, "idempotency-key": key, "content-length": str(size),
         "content-type": "application/octet-stream"}
    h.update(headers or {})
    with httpx.Client(timeout=timeout) as c:
        return c.post(url(env, path), headers=h, content=slow_body(body[: size // 2], body[size // 2:], pause))


# ---------------------------------------------------------------- decided from the root

def test_a_held_duplicate_still_uploading_takes_the_key_over_and_is_forwarded_whole(gateway):
    key = "wait-" + uuid.uuid4().hex
    # The first fails after 1 s; the duplicate arrives meanwhile and is held, its body still coming.
    first = {}
    t = threading.Thread(target=lambda: first.update(r=post(gateway, "/e/wait", key=key, headers={
        "x-demo-fail-first": "1", "x-demo-delay-ms": "1000"}, body=b"first")))
    t.start()
    time.sleep(0.3)
    r = slow_post(gateway, "/e/wait", key, size=8192, pause=1.5)
    t.join()
    assert first["r"].status == 500, describe(first["r"])
    assert r.status_code == 200, "the duplicate took the key over: %d %s" % (r.status_code, r.text[:300])
    j = r.json()
    assert j["n"] == 2 and j["body_bytes"] == 8192, "forwarded whole after the takeover: %s" % j
    again = post(gateway, "/e/wait", key=key, body=b"again")
    assert again.status == 200 and again.header("idempotent-replayed") == "true", describe(again)
    assert again.json()["n"] == 2, "the takeover's answer is replayed, not OUTCOME_UNKNOWN"


@pytest.mark.parametrize("n", [40, 200])
def test_concurrent_fresh_keys_whose_bodies_finish_late_are_all_forwarded_whole(gateway, n):
    keys = ["late-%d-%s" % (i, uuid.uuid4().hex) for i in range(n)]
    with ThreadPoolExecutor(max_workers=n) as pool:
        answers = list(pool.map(lambda k: slow_post(gateway, "/e/early", k, size=8192, pause=0.5), keys))
    bad = [(a.status_code, a.text[:200]) for a in answers if a.status_code != 200
           or a.json().get("body_bytes") != 8192]
    assert not bad, "%d of %d not forwarded whole: %s" % (len(bad), n, bad[:5])
    with ThreadPoolExecutor(max_workers=20) as pool:
        again = list(pool.map(lambda k: post(gateway, "/e/early", key=k, body=b"r"), keys))
    not_replayed = [describe(a) for a in again if a.status != 200 or a.header("idempotent-replayed") != "true"]
    assert not not_replayed, "%d not replayed: %s" % (len(not_replayed), not_replayed[:3])


def test_a_body_larger_than_envoys_buffer_reaches_the_upstream_on_a_route_deciding_at_the_headers(gateway):
    key = "big-" + uuid.uuid4().hex
    r = httpx.post(url(gateway, "/e/early"), content=b"b" * MIB2, timeout=30,
                   headers={"authorization": AUTH, "idempotency-key": key, "content-type": "application/octet-stream"})
    assert r.status_code == 200, "forwarded, not Envoy's own 413: %d %s" % (r.status_code, r.text[:200])
    assert r.json()["body_bytes"] == MIB2
    again = httpx.post(url(gateway, "/e/early"), content=b"b" * MIB2, timeout=30,
                       headers={"authorization": AUTH, "idempotency-key": key})
    assert again.status_code == 200 and again.headers.get("idempotent-replayed") == "true", again.text[:200]


# ---------------------------------------------------------------- early answers, real clients

@pytest.fixture(scope="module")
def early(gateway, upstream):
    """The keys whose repeats are answered at the headers: a completed one (replay, 422) and a
    completed one on the `reject` route (409)."""
    done, rejected = "done-" + uuid.uuid4().hex, "rej-" + uuid.uuid4().hex
    for path, key in (("/e/early", done), ("/e/reject", rejected)):
        r = post(gateway, path, key=key, headers={"x-variant": "a"}, body=b"first")
        assert r.status == 200, describe(r)
    # A key whose first request is still running: on Redis the repeat's 409 is decided by a Webdis
    # call, while its body keeps arriving (the answer cache knows completed keys only).
    busy = "busy-" + uuid.uuid4().hex
    threading.Thread(target=lambda: post(gateway, "/e/reject", key=busy, headers={"x-demo-delay-ms": "550000"},
                                         body=b"first", timeout=600), daemon=True).start()
    assert stack.wait_until(lambda: upstream.calls(key=busy) == 1, 10), "the first request never reached the service"
    return {
        "replay": ("/e/early", {"idempotency-key": done, "x-variant": "a"}, 200, None),
        "409": ("/e/reject", {"idempotency-key": rejected}, 409, None),
        "in_progress": ("/e/reject", {"idempotency-key": busy}, 409, "REQUEST_IN_PROGRESS"),
        "422": ("/e/early", {"idempotency-key": done, "x-variant": "b"}, 422, "IDEMPOTENCY_KEY_REUSED"),
        "400": ("/e/early", {}, 400, "IDEMPOTENCY_KEY_MISSING"),
        "413": ("/e/small", {"idempotency-key": "small-" + uuid.uuid4().hex}, 413, "IDEMPOTENCY_BODY_TOO_LARGE"),
    }


N = 100
KINDS = ["replay", "409", "in_progress", "422", "400", "413"]



@pytest.fixture(scope="module")
def upload(tmp_path_factory):
    f = tmp_path_factory.mktemp("upload") / "2mib.bin"
    f.write_bytes(b"u" * MIB2)
    return f


def check(kind, status, want_status, code, body):
    if status != want_status:
        return "%s: HTTP %s, want %d: %s" % (kind, status, want_status, body[:200])
    if code is not None and code not in body:
        return "%s: no %s in %s" % (kind, code, body[:200])
    return None


def curl(env, early, upload, kind, http):
    path, headers, want, code = early[kind]
    # No `Expect: 100-continue` (curl's own for a body over 1 MiB, which waits for Envoy's 100
    # before uploading): the body streams at once, as most HTTP clients send it, and arrives while
    # a Webdis call is out.
    args = ["curl", "-sS", http, "-X", "POST", "--data-binary", "@%s" % upload, "-H", "Expect:",
            "-H", "authorization: %s" % AUTH, "-H", "content-type: application/octet-stream",
            "-w", "\\n%{http_code} %{exitcode}\\n"]
    for k, v in headers.items():
        args += ["-H", "%s: %s" % (k, v)]
    errors = []
    for _ in range(N):
        p = subprocess.run(args + [url(env, path)], capture_output=True, timeout=60)
        out = p.stdout.decode(errors="replace")
        body, _, tail = out.rstrip("\n").rpartition("\n")
        status, _, exitcode = tail.partition(" ")
        if p.returncode != 0:
            errors.append("%s: curl exit %d (%s) %s" % (kind, p.returncode, p.stderr.decode()[:200], tail))
            continue
        e = check(kind, int(status or 0), want, code, body)
        if e:
            errors.append(e)
    return errors


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("http", ["--http2-prior-knowledge", "--http1.1"])
def test_curl_reads_every_early_answer_while_uploading_2mib(gateway, early, upload, kind, http):
    errors = curl(gateway, early, upload, kind, http)
    assert not errors, "%d of %d answers lost or wrong: %s" % (len(errors), N, errors[:5])


@pytest.mark.parametrize("kind", KINDS)
def test_httpx_over_http2_reads_every_early_answer_while_uploading_2mib(gateway, early, kind):
    path, headers, want, code = early[kind]
    h = {"authorization": AUTH, "content-type": "application/octet-stream"}
    h.update(headers)
    body = b"h" * MIB2
    errors = []
    with httpx.Client(http1=False, http2=True, timeout=30) as c:
        for _ in range(N):
            try:
                r = c.post(url(gateway, path), headers=h, content=body)
            except httpx.HTTPError as e:
                errors.append("%s: %r" % (kind, e))
                continue
            assert r.http_version == "HTTP/2"
            e = check(kind, r.status_code, want, code, r.text)
            if e:
                errors.append(e)
    assert not errors, "%d of %d answers lost or wrong: %s" % (len(errors), N, errors[:5])


@pytest.mark.parametrize("kind", KINDS)
def test_nodes_http2_client_reads_every_early_answer_while_uploading_2mib(gateway, early, kind):
    path, headers, want, code = early[kind]
    h = {"authorization": AUTH}
    h.update(headers)
    p = subprocess.run(["node", str(SDK / "h2_upload.mjs"), url(gateway, path), str(N), str(MIB2), json.dumps(h)],
                       capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr.decode()[-1000:]
    lines = [json.loads(line) for line in p.stdout.decode().splitlines() if line.strip()]
    assert len(lines) == N, p.stdout.decode()[-1000:]
    errors = [line.get("error") and "%s: %s" % (kind, line["error"])
              or check(kind, int(line["status"]), want, code, line["body"]) for line in lines]
    errors = [e for e in errors if e]
    assert not errors, "%d of %d answers lost or wrong: %s" % (len(errors), N, errors[:5])
