"""Unknown outcomes resolved by asking the service (`[route.reconcile]`), in real Envoy on both
stores (the shared store; Redis through Webdis with two Envoys, requests alternating between them):
a first attempt that timed out after the business ran is answered with the business's answer; one
reset before the business acted runs on the repeat; a lookup that fails leaves the 409; twenty
concurrent repeats share one lookup; a key that holds `/`, `..` or `%00` stays in its path segment
(the demo upstream refuses a lookup whose key is not one segment)."""

import itertools
import threading
import time
import uuid

import pytest

import stack
from conftest import new_key
from idemtest import assert_outcome_unknown, counters, delta, describe, fire, post, wait_for

POLICY = """
[[route]]
name = "rc-create"
match = { method = "POST", path = "/rc/create" }

[route.key]
scope = ["header:authorization"]
on_in_flight = "wait"
wait_timeout = "10s"

[route.reconcile]
lookup = "/orders/by-key/{key}?delay_ms=300"
timeout = "3s"

[[route]]
name = "rc-broken"
match = { method = "POST", path = "/rc/broken" }

[route.key]
scope = ["header:authorization"]

[route.reconcile]
lookup = "/orders/broken/{key}"
"""

PASS = {"name": "passthrough", "match": {"prefix": "/"}, "idem": False}
# The first attempts time out at the route: Envoy answers 504, the business goes on and runs.
ROUTES = stack.routes_from_policy(POLICY, envoy={"rc-create": {"timeout": "1s"}, "rc-broken": {"timeout": "1s"}},
                                  after=[PASS])
AUTH = "Bearer merchant-7"
REDIS_POLICY = stack.redis_table(timeout="1s", prefix="idem-rc-%s:" % uuid.uuid4().hex[:6]) + POLICY.replace(
    'path = "/rc/create" }\n', 'path = "/rc/create" }\nstore = "redis"\n'
).replace('path = "/rc/broken" }\n', 'path = "/rc/broken" }\nstore = "redis"\n')


class Fleet:
    """Envoys sharing one Redis, taking requests in turn; counters summed over them."""

    def __init__(self, envs):
        self.envs = envs
        self._turn = itertools.cycle(envs)
        self._lock = threading.Lock()

    def request(self, *args, **kw):
        with self._lock:
            env = next(self._turn)
        return env.request(*args, **kw)

    def stats(self, prefix):
        total = {}
        for env in self.envs:
            for k, v in env.stats(prefix).items():
                total[k] = total.get(k, 0) + v
        return total


@pytest.fixture(scope="module", params=["shared", "redis"])
def gw(request, workdir, upstream):
    if request.param == "shared":
        env = stack.start_idem_envoy(workdir, upstream.port, POLICY, routes=ROUTES, name="envoy-reconcile")
        yield env
        env.stop()
        return
    redis_stack = request.getfixturevalue("redis_stack")
    assert REDIS_POLICY.count('store = "redis"') == 2, REDIS_POLICY
    envs = stack.start_fleet(workdir, upstream.port, redis_stack.webdis.port, REDIS_POLICY, routes=ROUTES, n=2)
    yield Fleet(envs)
    for e in envs:
        e.stop()


def create(gw, key, headers=None, path="/rc/create"):
    return post(gw, path, key, auth=AUTH, headers=headers, body={"sku": "A1", "amount": "100.00"}, timeout=20)


def timed_out_after_running(gw, upstream, key, path="/rc/create"):
    """The first attempt: Envoy's route times out at 1 s, the business finishes its run at 1.5 s."""
    started = time.monotonic()
    first = create(gw, key, headers={"x-demo-delay-ms": "1500"}, path=path)
    assert first.status == 504, describe(first)
    assert upstream.calls(key) == 1
    # A duration is the scenario: the run ends by the clock, after Envoy gave up on it.
    time.sleep(max(0.0, 1.7 - (time.monotonic() - started)))


def test_a_timed_out_first_attempt_gets_the_businesss_answer_from_the_lookup(gw, upstream):
    key = new_key("rc") + "/../x%00"
    before = counters(gw, "rc-create")
    timed_out_after_running(gw, upstream, key)
    repeat = create(gw, key)
    assert repeat.status == 200, describe(repeat)
    assert repeat.header("idempotent-replayed") == "true" and repeat.header("idempotency-reconciled") == "true", \
        describe(repeat)
    body = repeat.json()
    assert (body["key"], body["n"]) == (key, 1), body
    third = create(gw, key)
    assert third.status == 200 and third.json() == body, describe(third)
    assert third.header("idempotent-replayed") == "true" and third.header("idempotency-reconciled") is None
    assert upstream.calls(key) == 1, "the business ran once"
    assert upstream.lookups(key) == 1, "one lookup, with the key as one path segment"
    # Counted once the writes are in (on Redis the reconciled answer is written after it is sent).
    wait_for(lambda: delta(before, counters(gw, "rc-create")).get("replayed") == 1, 5, what="the counts")
    d = delta(before, counters(gw, "rc-create"))
    assert (d.get("held"), d.get("reconciled_ran"), d.get("replayed")) == (1, 1, 1), d


def test_a_first_attempt_reset_before_the_business_acted_runs_once_on_the_repeat(gw, upstream):
    key = new_key("rc")
    before = counters(gw, "rc-create")
    first = create(gw, key, headers={"x-demo-reset-before": "1"})
    assert first.status in (502, 503), describe(first)
    assert upstream.calls(key) == 0
    repeat = create(gw, key)
    assert repeat.status == 200 and repeat.header("idempotent-replayed") is None, describe(repeat)
    assert repeat.json()["n"] == 1
    assert create(gw, key).json() == repeat.json(), "later repeats replay the repeat's answer"
    assert (upstream.calls(key), upstream.lookups(key)) == (1, 1)
    wait_for(lambda: delta(before, counters(gw, "rc-create")).get("stored") == 1, 5, what="the counts")
    d = delta(before, counters(gw, "rc-create"))
    assert (d.get("held"), d.get("reconciled_absent"), d.get("stored")) == (1, 1, 1), d


def test_a_lookup_that_fails_leaves_the_409_and_the_next_repeat_asks_again(gw, upstream):
    key = new_key("rc")
    before = counters(gw, "rc-broken")
    timed_out_after_running(gw, upstream, key, path="/rc/broken")
    assert_outcome_unknown(create(gw, key, path="/rc/broken"))
    assert_outcome_unknown(create(gw, key, path="/rc/broken"))
    assert upstream.calls(key) == 1
    assert upstream.lookups(key) == 2
    assert delta(before, counters(gw, "rc-broken")).get("reconcile_failed") == 2


def test_twenty_concurrent_repeats_share_one_lookup(gw, upstream):
    key = new_key("rc")
    timed_out_after_running(gw, upstream, key)
    answers = fire(20, lambda _: create(gw, key))
    assert all(r.status == 200 for r in answers), [describe(r) for r in answers if r.status != 200][:3]
    assert len({r.body for r in answers}) == 1, "every repeat gets the one answer"
    reconciled = [r for r in answers if r.header("idempotency-reconciled") == "true"]
    assert len(reconciled) == 1, "one repeat asked; the others waited and got its answer as a replay"
    assert (upstream.calls(key), upstream.lookups(key)) == (1, 1)
    wait_for(lambda: counters(gw, "rc-create").get("reconciled_ran", 0) >= 1, 5, what="the count")
