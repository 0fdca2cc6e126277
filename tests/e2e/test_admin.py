"""The operator's tool for unknown outcomes on the Redis store (`idem-admin`, target/debug/idem-admin
or $IDEM_ADMIN), against real Redis shared by two Envoys through Webdis, run as the ACL user
docs/unknown-outcomes.md documents: a held key is listed, released (the next repeat runs) or
resolved with an answer (the next repeats replay it, on either Envoy); a key another request has
taken since is never changed; malformed store keys, headers and credentials are refused clearly."""

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


def order(env, key, headers=None, body=None, path="/a/order"):
    return post(env, path, key, auth=AUTH, headers=headers, body=body or {"sku": "A1", "amount": "100.00"}, timeout=20)


def store_key_of(env, key):
    """The store key the filter's unknown_outcome line names for `key` (what an operator starts from)."""
    def found():
        for line in env.log_text().splitlines():
            if "idem: unknown_outcome " in line:
                record = json.loads(line.split("idem: unknown_outcome ", 1)[1])
                if record["key_prefix"] == key[:8] + "…" and record["store"] == "redis":
                    return record["store_key"]
        return None
    wait_for(lambda: found() is not None, 5, what="the unknown_outcome log line of %s" % key)
    return found()


def listed(redis_stack):
    done = admin(redis_stack, "list", "--json")
    assert done.returncode == 0, done.stderr
    return {e["store_key"]: e for e in json.loads(done.stdout)}


def record(redis_stack, store_key):
    return redis_stack.redis.command("GET", store_key)


def test_a_released_key_lets_the_next_repeat_run(fleet, upstream, redis_stack):
    a, b = fleet
    key = new_key("adm-rel")
    # The upstream drops the connection before doing anything: the outcome is unknown to idem.
    first = order(a, key, headers={"x-demo-reset-before": "1"})
    assert first.status >= 500, describe(first)
    store_key = store_key_of(a, key)
    assert_outcome_unknown(order(b, key))
    entry = listed(redis_stack)[store_key]
    assert entry["first_seen_at"] < entry["held_until"], entry
    table = admin(redis_stack, "list")
    assert table.returncode == 0 and store_key in table.stdout and entry["owner"] in table.stdout, table

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
