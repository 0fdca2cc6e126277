"""The operator's tool for unknown outcomes (`idem-admin`, target/debug/idem-admin or $IDEM_ADMIN) on
both stores: on Redis against real Redis shared by two Envoys through Webdis, as the ACL user
docs/unknown-outcomes.md documents; on the shared store through the filter's own admin listener
(`role = "admin"`) in the gateway's Envoy. A held key is listed, released (the next repeat runs) or
resolved with an answer (the next repeats replay it); a key another request has taken since is
never changed; malformed store keys, headers and credentials are refused clearly; the admin
listener wants its secret and is not reachable from the ingress listener."""

import json
import os
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

import stack
from conftest import new_key
from idemtest import assert_outcome_unknown, describe, post, wait_for

ADMIN = Path(os.environ.get("IDEM_ADMIN") or stack.REPO / "target" / "debug" / "idem-admin")
PREFIX = "idem-admin-%s:" % uuid.uuid4().hex[:6]
# The operator's own ACL user, exactly as docs/unknown-outcomes.md creates it.
OPERATOR = ("idem-operator", "operator-password-for-tests")
OPERATOR_ACL = ["on", ">" + OPERATOR[1], "~idem*", "resetchannels", "-@all", "+scan", "+get", "+eval", "+del", "+set"]

POLICY = stack.redis_table(timeout="1s", prefix=PREFIX) + """
[[route]]
name = "a-order"
match = { method = "POST", path = "/a/order" }
store = "redis"

[route.key]
scope = ["header:authorization"]

[[route]]
name = "a-short"
match = { method = "POST", path = "/a/short" }
store = "redis"

[route.key]
scope = ["header:authorization"]
unknown_outcome_hold = "3s"
"""
PASS = {"name": "passthrough", "match": {"prefix": "/"}, "idem": False}
ROUTES = stack.routes_from_policy(POLICY, envoy={"a-order": {"timeout": "1s"}, "a-short": {"timeout": "3s"}},
                                  after=[PASS])
AUTH = "Bearer merchant-42"
ADMIN_SECRET = "admin-secret-" + uuid.uuid4().hex  # 45 characters
SHARED_POLICY = POLICY.split("[[route]]", 1)[1].replace('store = "redis"', 'store = "shared"')
SHARED_POLICY = "[[route]]" + SHARED_POLICY


@pytest.fixture(scope="module")
def fleet(workdir, upstream, redis_stack):
    assert ADMIN.is_file(), "%s is missing: build it with `cargo build -p idem-admin` (or set IDEM_ADMIN)" % ADMIN
    redis_stack.redis.command("ACL", "SETUSER", OPERATOR[0], *OPERATOR_ACL)
    envs = stack.start_fleet(workdir, upstream.port, redis_stack.webdis.port, POLICY, routes=ROUTES, n=2)
    yield envs
    for e in envs:
        e.stop()


def admin(redis_stack, *args, user=OPERATOR):
    url = "redis://%s:%s@127.0.0.1:%d/" % (user[0], user[1], redis_stack.redis.port)
    return subprocess.run([str(ADMIN), "--prefix", PREFIX, *args], capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, IDEM_REDIS_URL=url))


@pytest.fixture(scope="module")
def gw(workdir, upstream):
    """One Envoy on the shared store, with the operator's listener beside its ingress."""
    assert ADMIN.is_file(), "%s is missing: build it with `cargo build -p idem-admin` (or set IDEM_ADMIN)" % ADMIN
    env = stack.start_idem_envoy(workdir, upstream.port, SHARED_POLICY, routes=ROUTES, name="envoy-admin",
                                 idem_admin_secret=ADMIN_SECRET)
    yield env
    env.stop()


def shared_admin(gw, *args, secret=ADMIN_SECRET):
    env = {k: v for k, v in os.environ.items() if not k.startswith("IDEM_")}
    env.update(IDEM_ADMIN_URL="http://127.0.0.1:%d" % gw.idem_admin_port, IDEM_ADMIN_SECRET=secret)
    return subprocess.run([str(ADMIN), *args], capture_output=True, text=True, timeout=30, env=env)


def order(env, key, headers=None, body=None, path="/a/order"):
    return post(env, path, key, auth=AUTH, headers=headers, body=body or {"sku": "A1", "amount": "100.00"}, timeout=20)


def unknown_outcome_record(env, key, store="redis"):
    """The filter's unknown_outcome line for `key`, as JSON (what an operator starts from)."""
    def found():
        for line in env.log_text().splitlines():
            if "idem: unknown_outcome " in line:
                record = json.loads(line.split("idem: unknown_outcome ", 1)[1])
                if record["key_prefix"] == key[:8] + "…" and record["store"] == store:
                    return record
        return None
    wait_for(lambda: found() is not None, 5, what="the unknown_outcome log line of %s" % key)
    return found()


def store_key_of(env, key, store="redis"):
    """The store key the filter's unknown_outcome line names for `key`."""
    return unknown_outcome_record(env, key, store)["store_key"]


def listed(redis_stack, run=admin):
    done = run(redis_stack, "list", "--json")
    assert done.returncode == 0, done.stderr
    return {e["store_key"]: e for e in json.loads(done.stdout)}


def record(redis_stack, store_key):
    return redis_stack.redis.command("GET", store_key)


def test_a_released_key_lets_the_next_repeat_run(fleet, upstream, redis_stack):
    a, b = fleet
    # A key whose prefix holds the record's separator and a percent-escape: listed as it was sent.
    key = new_key("a|%7C")
    # The upstream drops the connection before doing anything: the outcome is unknown to idem.
    first = order(a, key, headers={"x-demo-reset-before": "1"})
    assert first.status >= 500, describe(first)
    store_key = store_key_of(a, key)
    assert_outcome_unknown(order(b, key))
    entry = listed(redis_stack)[store_key]
    assert entry["first_seen_at"] < entry["held_until"], entry
    assert (entry["route"], entry["key_prefix"]) == ("a-order", key[:8] + "…"), entry
    table = admin(redis_stack, "list")
    assert table.returncode == 0 and store_key in table.stdout and entry["owner"] in table.stdout, table
    row = next(line for line in table.stdout.splitlines() if store_key in line)
    assert row.split()[:2] == ["a-order", key[:8] + "…"], table.stdout

    done = admin(redis_stack, "release", store_key, "--owner", entry["owner"])
    assert (done.returncode, done.stdout.strip()) == (0, "released %s" % store_key), done
    assert store_key not in listed(redis_stack)
    again = admin(redis_stack, "release", store_key)
    assert again.returncode == 1 and "does not exist" in again.stderr, again

    retry = order(b, key)
    assert retry.status == 200 and retry.json()["n"] == 1, describe(retry)
    assert upstream.calls(key) == 1


def test_a_resolved_key_replays_the_operators_answer_on_every_envoy(fleet, upstream, redis_stack):
    a, b = fleet
    key = new_key("adm-res")
    # Envoy gives up at 1 s, the business runs to the end at 1.5 s: it ran, the client does not know.
    first = order(a, key, headers={"x-demo-delay-ms": "1500"})
    assert first.status == 504, describe(first)
    wait_for(lambda: upstream.calls(key) == 1, 5, what="the business to run")
    store_key = store_key_of(a, key)
    ttl_before = redis_stack.redis.command("PTTL", store_key)
    # A body with quotes, a pipe and CR LF: the record's separators and the JSON must not bend.
    answer = {"order_id": "ord-\"7|8\"", "note": "line1\r\nline2", "amount": 12345678901234567890}
    done = admin(redis_stack, "--json", "resolve", store_key, "--status", "201", "--header", "X-Order-Id: ord-7",
                 "--body", json.dumps(answer))
    assert done.returncode == 0, done
    assert json.loads(done.stdout)["result"] == "resolved", done.stdout
    assert 0 < redis_stack.redis.command("PTTL", store_key) <= ttl_before, "the answer outlives the hold"

    for env in (b, a):
        r = order(env, key)
        assert r.status == 201 and r.header("idempotent-replayed") == "true", describe(r)
        assert r.body == json.dumps(answer).encode() and r.header("x-order-id") == "ord-7", describe(r)
        assert r.header("content-type") == "application/json", describe(r)
    other = order(a, key, body={"sku": "B2", "amount": "1.00"})
    assert other.status == 422, describe(other)
    assert upstream.calls(key) == 1
    # Resolved once: a second resolve finds a stored answer, not an unknown outcome.
    twice = admin(redis_stack, "resolve", store_key, "--status", "200", "--body", "{}")
    assert twice.returncode == 1 and "holds a stored answer" in twice.stderr, twice


def test_a_key_taken_by_another_request_is_never_changed(fleet, upstream, redis_stack):
    a, _ = fleet
    key = new_key("adm-race")
    order(a, key, headers={"x-demo-reset-before": "1"}, path="/a/short")
    store_key = store_key_of(a, key)
    old_owner = listed(redis_stack)[store_key]["owner"]
    # The 3 s hold ends; the client's next attempt takes the key (its upstream is slow) ...
    time.sleep(3.2)
    pending = {}
    t = threading.Thread(target=lambda: pending.setdefault(
        "r", order(a, key, headers={"x-demo-delay-ms": "4000"}, path="/a/short")))
    t.start()
    wait_for(lambda: (record(redis_stack, store_key) or b"").startswith(b"I|"), 5, what="the new claim")
    in_flight = record(redis_stack, store_key)
    # ... so the operator's late release and resolve change nothing while it runs (3 s),
    for args in (["release", store_key], ["resolve", store_key, "--status", "200", "--body", "{}"]):
        done = admin(redis_stack, *args)
        assert done.returncode == 1 and "a claim in flight" in done.stderr, done
        assert record(redis_stack, store_key) == in_flight
    t.join()
    assert pending["r"].status == 504, describe(pending["r"])
    # ... nor once it is an unknown outcome of its own: the operator's --owner is the old one.
    wait_for(lambda: (record(redis_stack, store_key) or b"").startswith(b"U|"), 5, what="the second unknown outcome")
    second = record(redis_stack, store_key)
    assert not second.startswith(b"U|" + old_owner.encode())
    done = admin(redis_stack, "release", store_key, "--owner", old_owner)
    assert done.returncode == 1 and "another request" in done.stderr, done
    assert record(redis_stack, store_key) == second


@pytest.mark.parametrize("args,message", [
    (["release", "idem:k:../../etc"], "is not a claim key"),
    (["release", PREFIX + "t:" + "a" * 64], "is not a claim key"),
    (["resolve", PREFIX + "k:" + "a" * 64, "--status", "200", "--header", "x-a: 1\r\nset-cookie: s=1"],
     "not a valid HTTP header"),
    (["resolve", PREFIX + "k:" + "a" * 64, "--status", "700"], "700 is not in 200..=599"),
])
def test_malformed_input_is_refused_before_redis_is_touched(fleet, redis_stack, args, message):
    done = admin(redis_stack, *args)
    assert done.returncode == 2 and message in done.stderr, done


def test_a_wrong_password_is_a_clear_error_that_hides_the_password(fleet, redis_stack):
    done = admin(redis_stack, "list", user=(OPERATOR[0], "not-the-password"))
    assert done.returncode == 2 and "not-the-password" not in done.stderr, done
    assert "idem-operator:***@127.0.0.1" in done.stderr, done
    # Webdis' user (the filter's) is not the operator: its ACL has no SCAN.
    done = admin(redis_stack, "list", user=("default", stack.REDIS_PASSWORD))
    assert done.returncode == 2 and "NOPERM" in done.stderr, done


# ---------------------------------------------------------------------------- the shared store

def test_shared_a_released_key_lets_the_next_repeat_run(gw, upstream):
    key = new_key("s|%7C")
    first = order(gw, key, headers={"x-demo-reset-before": "1"})
    assert first.status >= 500, describe(first)
    store_key = store_key_of(gw, key, store="shared")
    assert store_key.startswith("s:"), store_key
    assert_outcome_unknown(order(gw, key))
    entry = listed(gw, run=shared_admin)[store_key]
    assert entry["first_seen_at"] < entry["held_until"] and entry["looking_up"] is False, entry
    assert (entry["route"], entry["key_prefix"]) == ("a-order", key[:8] + "…"), entry
    table = shared_admin(gw, "list")
    assert table.returncode == 0 and store_key in table.stdout and entry["owner"] in table.stdout, table
    row = next(line for line in table.stdout.splitlines() if store_key in line)
    assert row.split()[:2] == ["a-order", key[:8] + "…"], table.stdout

    done = shared_admin(gw, "release", store_key, "--owner", entry["owner"])
    assert (done.returncode, done.stdout.strip()) == (0, "released %s" % store_key), done
    assert store_key not in listed(gw, run=shared_admin)
    again = shared_admin(gw, "release", store_key)
    assert again.returncode == 1 and "does not exist" in again.stderr, again
    retry = order(gw, key)
    assert retry.status == 200 and retry.json()["n"] == 1, describe(retry)
    assert "idem: admin released %s" % store_key in gw.log_text()


def test_shared_a_resolved_key_replays_the_operators_answer(gw, upstream):
    key = new_key("sadm-res")
    first = order(gw, key, headers={"x-demo-delay-ms": "1500"})
    assert first.status == 504, describe(first)
    wait_for(lambda: upstream.calls(key) == 1, 5, what="the business to run")
    store_key = store_key_of(gw, key, store="shared")
    answer = {"order_id": "ord-\"7|8\"", "note": "line1\r\nline2", "amount": 12345678901234567890}
    done = shared_admin(gw, "--json", "resolve", store_key, "--status", "201", "--header", "X-Order-Id: ord-7",
                        "--body", json.dumps(answer))
    assert done.returncode == 0 and json.loads(done.stdout)["result"] == "resolved", done
    for _ in range(2):
        r = order(gw, key)
        assert r.status == 201 and r.header("idempotent-replayed") == "true", describe(r)
        assert r.body == json.dumps(answer).encode() and r.header("x-order-id") == "ord-7", describe(r)
    assert order(gw, key, body={"sku": "B2", "amount": "1.00"}).status == 422
    assert upstream.calls(key) == 1
    twice = shared_admin(gw, "resolve", store_key, "--status", "200", "--body", "{}")
    assert twice.returncode == 1 and "holds a stored answer" in twice.stderr, twice


def test_shared_a_key_taken_by_another_request_is_never_changed(gw, upstream):
    key = new_key("sadm-race")
    order(gw, key, headers={"x-demo-reset-before": "1"}, path="/a/short")
    store_key = store_key_of(gw, key, store="shared")
    old_owner = listed(gw, run=shared_admin)[store_key]["owner"]
    time.sleep(3.2)  # the 3 s hold ends; the client's next attempt takes the key (its upstream is slow) ...
    pending = {}
    t = threading.Thread(target=lambda: pending.setdefault(
        "r", order(gw, key, headers={"x-demo-delay-ms": "4000"}, path="/a/short")))
    t.start()
    wait_for(lambda: upstream.calls(key) == 1, 5, what="the new claim to reach the business")
    # ... so the operator's late release and resolve change nothing while it runs (3 s),
    for args in (["release", store_key], ["resolve", store_key, "--status", "200", "--body", "{}"]):
        done = shared_admin(gw, *args)
        assert done.returncode == 1 and "a claim in flight" in done.stderr, done
    t.join()
    assert pending["r"].status == 504, describe(pending["r"])
    # ... nor once it is an unknown outcome of its own: the operator's --owner is the old one.
    wait_for(lambda: store_key in listed(gw, run=shared_admin), 5, what="the second unknown outcome")
    second = listed(gw, run=shared_admin)[store_key]
    assert second["owner"] != old_owner
    done = shared_admin(gw, "release", store_key, "--owner", old_owner)
    assert done.returncode == 1 and "another request" in done.stderr, done
    assert listed(gw, run=shared_admin)[store_key] == second


def raw_admin(gw, method, path, secret=ADMIN_SECRET, body=None, port=None):
    headers = {"authorization": "Bearer %s" % secret} if secret is not None else {}
    return stack.request(port or gw.idem_admin_port, method, path, headers=headers, body=body)


def test_shared_the_admin_listener_wants_its_secret_and_is_not_on_the_ingress(gw):
    for secret in (None, "wrong", ADMIN_SECRET[:-1], ADMIN_SECRET + "x"):
        r = raw_admin(gw, "GET", "/unknown", secret=secret)
        assert r.status == 401 and r.json()["code"] == "UNAUTHORIZED", describe(r)
        assert r.header("www-authenticate") == "Bearer", describe(r)
    assert raw_admin(gw, "GET", "/unknown").status == 200
    wrong = shared_admin(gw, "list", secret="wrong-secret")
    assert wrong.returncode == 2 and "401" in wrong.stderr, wrong
    # The ingress listener has no admin API: /unknown there is an ordinary request, which the
    # upstream answers (the demo upstream echoes its method and path).
    r = raw_admin(gw, "GET", "/unknown", port=gw.listen_port)
    assert r.status == 200 and (r.json()["method"], r.json()["path"]) == ("GET", "/unknown"), describe(r)
    assert b"store_key" not in r.body, describe(r)
    r = raw_admin(gw, "POST", "/unknown/s:0:%s/release" % ("0" * 32), port=gw.listen_port)
    assert b"released" not in r.body and b"absent" not in r.body, describe(r)


@pytest.mark.parametrize("method,path,body,status,message", [
    ("POST", "/unknown/s:1:..%2F..%2Fx/release", None, 400, "is not a shared-store key"),
    ("POST", "/unknown/idem:k:%s/release" % ("a" * 64), None, 400, "is not a shared-store key"),
    ("POST", "/unknown/s:1:%s/release?owner=xyz" % ("a" * 32), None, 400, "is not 16 hex digits"),
    ("POST", "/unknown/s:1:%s/resolve" % ("a" * 32), b'{"status":700}', 400, "from 200 to 599"),
    ("POST", "/unknown/s:1:%s/resolve" % ("a" * 32), b'{"status":200,"headers":[["x-a","1\\r\\nset-cookie: s=1"]]}',
     400, "without CR, LF or NUL"),
    ("POST", "/unknown/s:1:%s/resolve" % ("a" * 32), b"not json", 400, "is not JSON"),
    ("GET", "/unknown/s:1:%s/release" % ("a" * 32), None, 405, "POST"),
    ("DELETE", "/unknown", None, 405, "GET /unknown"),
    ("GET", "/elsewhere", None, 404, "serves GET /unknown"),
    ("POST", "/unknown/s:1:%s/release" % ("a" * 32), None, 404, "does not exist"),
])
def test_shared_malformed_calls_get_a_clear_answer(gw, method, path, body, status, message):
    r = raw_admin(gw, method, path, body=body)
    assert r.status == status and message in r.json()["message"], describe(r)


def test_shared_the_cli_refuses_a_malformed_key_before_calling(gw):
    done = shared_admin(gw, "release", "s:1:../../etc")
    assert done.returncode == 2 and "is not a shared-store key" in done.stderr, done


@pytest.mark.parametrize("store", ["redis", "shared"])
def test_show_says_what_the_store_holds_for_a_clients_key(request, store, tmp_path):
    """`idem-admin show --policy … --route R --key K --header 'Authorization: …'`: the operator's
    question "what happened to this key?" — absent, claimed while the request runs, completed with
    its status, an unknown outcome with its hold — computed from the route's policy and the
    caller, on either store; another caller's same key is another key (issue 54)."""
    policy = tmp_path / "policies.toml"
    if store == "redis":
        redis_stack = request.getfixturevalue("redis_stack")
        env = request.getfixturevalue("fleet")[0]
        policy.write_text(POLICY)
        run = lambda *args: admin(redis_stack, *args)  # noqa: E731
    else:
        env = request.getfixturevalue("gw")
        policy.write_text(SHARED_POLICY)
        run = lambda *args: shared_admin(env, *args)  # noqa: E731

    def show(key, route="a-order", auth=AUTH):
        done = run("show", "--json", "--policy", str(policy), "--route", route, "--key", key,
                   "--header", "Authorization: %s" % auth)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    fresh = new_key("show")
    assert show(fresh)["state"] == "absent"
    done = order(env, fresh)
    assert done.status == 200, describe(done)
    got = show(fresh)
    assert (got["state"], got.get("status"), got.get("answer_kept")) == ("completed", 200, True), got
    assert got["first_seen_at"].endswith("Z") and got["key"] == fresh and len(got["scoped_id"]) == 64, got
    assert show(fresh, auth="Bearer another-merchant")["state"] == "absent", "another caller's key is another key"

    # While the request runs: claimed, with its lease.
    running = new_key("show-run")
    t = threading.Thread(target=lambda: order(env, running, headers={"x-demo-delay-ms": "2000"}, path="/a/short"))
    t.start()
    try:
        wait_for(lambda: show(running, route="a-short")["state"] == "claimed", 5, what="the claim")
        got = show(running, route="a-short")
        assert got["lease_ends_at"] > got["first_seen_at"] and len(got["owner"]) == 16, got
    finally:
        t.join(10)
    wait_for(lambda: show(running, route="a-short")["state"] == "completed", 5, what="the completion")

    # A first attempt that timed out at the gateway after it reached the service: held.
    unknown = new_key("show-unknown")
    first = order(env, unknown, headers={"x-demo-delay-ms": "1500"})
    assert first.status == 504, describe(first)
    wait_for(lambda: show(unknown)["state"] == "unknown_outcome", 5, what="the unknown outcome")
    got = show(unknown)
    assert got["held_until"] > got["first_seen_at"] and got["looking_up"] is False, got
    assert got["store_key"] == store_key_of(env, unknown, store), "the store key the unknown_outcome line names"
    # The gateway's log lines carry the key's digest, which show prints: a line and a key are
    # matched without the line holding the whole key.
    digest = got["key_digest"]
    assert len(digest) == 12 and unknown not in env.log_text(), "the whole key is never logged"
    assert "key_digest=%s" % digest in env.log_text(), "the held line of the key names its digest"
    assert unknown_outcome_record(env, unknown, store)["key_digest"] == digest, "so does its unknown_outcome record"

    # For people: one line per fact.
    text = run("show", "--policy", str(policy), "--route", "a-order", "--key", fresh,
               "--header", "Authorization: %s" % AUTH)
    assert text.returncode == 0 and "completed: 200 — its answer stored" in text.stdout, text.stdout
    # A caller the route needs and the operator did not give: the reason, not a guess.
    bare = run("show", "--policy", str(policy), "--route", "a-order", "--key", fresh)
    assert bare.returncode == 2 and "keeps keys per caller" in bare.stderr and "--header" in bare.stderr, bare.stderr
