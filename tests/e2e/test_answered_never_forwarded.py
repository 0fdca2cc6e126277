"""A request the gateway answers never also reaches the service (issue 53), tried as a CloudEvents
broker delivers: the first delivery's client gives up after 1 s while the service still runs it
(the key is held: an unknown outcome), and the broker delivers again — while the event runs (the
service's lookup answers 409: the broker gets 409 IDEMPOTENCY_OUTCOME_UNKNOWN) and after it ran
(the lookup answers 200: the broker gets the event's answer replayed). A first delivery the
service never saw (reset before it acted) is looked up 404 and runs on the re-delivery. The
service counts every execution, at arrival: exactly one per event in every case.

Over both stores, one and two Envoy workers, a key in a header (`ce-id`, binary mode) and in the
body (`/transaction_id`), the fingerprint on and off. With the fingerprint off and a header key,
the decision is made at the request headers while the body is still to come — the path on which
the lookup answered the repeat and its body chunk let it continue upstream, so the service ran
every delivery (the event ran three times). Each body here is sent with its headers in one write,
as brokers send them, so Envoy hands it to the filter in the callback after the headers'.

The issue 38 tests (test_reconcile.py) could not see it: they use the default fingerprint, which
reads the body before deciding, so no body chunk ever arrives while the lookup is out — they
count executions at the service, but on a path where the bug cannot happen."""

import socket
import threading
import time
import uuid

import pytest

import stack
from idemtest import assert_outcome_unknown, describe

# (route, key source, fingerprint on)
ROUTES_UNDER_TEST = [
    ("ce-header-fp", "header", True),
    ("ce-header-nofp", "header", False),
    ("ce-body-fp", "body", True),
    ("ce-body-nofp", "body", False),
]

ROUTE = """
[[route]]
name = "{name}"
match = {{ method = "POST", path = "/{name}" }}
{store}
[route.key]
{key}
scope = ["header:ce-source"]
{fingerprint}
[route.duplicate]
status = 200

[route.reconcile]
lookup = "{lookup}"
timeout = "2s"
ran = [200]
absent = [404]
"""


def policy(store):
    parts = []
    for name, source, fingerprint in ROUTES_UNDER_TEST:
        key, lookup = {
            "header": ('from = "header"\nname = "ce-id"', "/events/by-id/{key}"),
            "body": ('from = "body"\nname = "/transaction_id"', "/events/by-txn/{key}"),
        }[source]
        parts.append(ROUTE.format(name=name, store='store = "redis"' if store == "redis" else "", key=key,
                                  fingerprint="" if fingerprint else "fingerprint = []", lookup=lookup))
    text = "\n".join(parts)
    if store == "redis":
        text = stack.redis_table(timeout="1s", prefix="idem-anf-%s:" % uuid.uuid4().hex[:6]) + text
    return text


PASS = {"name": "passthrough", "match": {"prefix": "/"}, "idem": False}
ROUTES = stack.routes_from_policy(policy("shared"), after=[PASS])

# The service runs the first delivery this long; its client gives up after CLIENT_TIMEOUT.
RUNS_S = 3.0
CLIENT_TIMEOUT_S = 1.0
# Re-deliveries: while the event runs (after the client gave up), and after it ran.
WHILE_RUNNING_S = 1.8
AFTER_RUN_S = RUNS_S + 0.8


class Event:
    """One CloudEvent in binary mode: `ce-id` and a 26-byte-or-so JSON body with a transaction id."""

    def __init__(self, route, source):
        self.route, self.source = route, source
        self.id = "evt-" + uuid.uuid4().hex[:12]
        self.txn = "txn-" + uuid.uuid4().hex[:12]
        self.body = ('{"transaction_id":"%s","amount":100}' % self.txn).encode()

    def deliver(self, gw, extra=None, timeout=10.0):
        headers = {"ce-id": self.id, "ce-source": "//broker/orders", "ce-specversion": "1.0",
                   "ce-type": "order.paid", "content-type": "application/json"}
        headers.update(extra or {})
        return gw.request("POST", "/" + self.route, headers=headers, body=self.body, timeout=timeout)

    def executions(self, upstream):
        return upstream.calls(event=self.id)

    def lookups(self, upstream):
        key = ("event:" + self.id) if self.source == "header" else ("txn:" + self.txn)
        return upstream.lookups(key)


@pytest.fixture(scope="module", params=[("shared", 1), ("shared", 2), ("redis", 1), ("redis", 2)],
                ids=["shared-1w", "shared-2w", "redis-1w", "redis-2w"])
def gw(request, workdir, upstream):
    store, workers = request.param
    if store == "shared":
        env = stack.start_idem_envoy(workdir, upstream.port, policy("shared"), routes=ROUTES, concurrency=workers,
                                     name="envoy-anf-%d" % workers)
    else:
        redis_stack = request.getfixturevalue("redis_stack")
        env = stack.start_fleet(workdir, upstream.port, redis_stack.webdis.port, policy("redis"), routes=ROUTES, n=1,
                                concurrency=workers)[0]
    yield env
    env.stop()


def each_route(run):
    """Runs `run(route, source)` for every route at once; re-raises the first failure."""
    failures = []

    def one(route, source):
        try:
            run(route, source)
        except BaseException as e:  # noqa: BLE001 - reported below with its route
            failures.append("%s: %s" % (route, e))
    threads = [threading.Thread(target=one, args=(r, s)) for r, s, _ in ROUTES_UNDER_TEST]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures, "\n".join(failures)


def sleep_until(t0, at):
    time.sleep(max(0.0, at - (time.monotonic() - t0)))


def test_a_redelivery_answered_from_the_lookup_never_runs_the_event_again(gw, upstream):
    def run(route, source):
        event = Event(route, source)
        slow = {"x-demo-delay-ms": str(int(RUNS_S * 1000))}
        t0 = time.monotonic()
        # The broker's client gives up after 1 s and closes its connection: the event still runs.
        with pytest.raises((socket.timeout, TimeoutError)):
            event.deliver(gw, slow, timeout=CLIENT_TIMEOUT_S)
        # While it runs: the lookup answers 409, the broker gets the 409 — and nothing runs.
        sleep_until(t0, WHILE_RUNNING_S)
        assert_outcome_unknown(event.deliver(gw, slow))
        assert event.executions(upstream) == 1, "the re-delivery answered 409 also ran"
        # After it ran: the lookup's answer, replayed — and nothing runs.
        sleep_until(t0, AFTER_RUN_S)
        replayed = event.deliver(gw, slow)
        assert replayed.status == 200, describe(replayed)
        assert replayed.header("idempotent-replayed") == "true", describe(replayed)
        assert replayed.json()["event"] == event.id, describe(replayed)
        # A forward made at the instant of the answer would arrive at once; give it time anyway.
        time.sleep(0.5)
        assert event.executions(upstream) == 1, "the re-delivery answered from the lookup also ran"
        assert event.lookups(upstream) == 2
        # The key now holds the answer: a fourth delivery is replayed without asking.
        again = event.deliver(gw, slow)
        assert again.status == 200 and again.header("idempotent-replayed") == "true", describe(again)
        assert (event.executions(upstream), event.lookups(upstream)) == (1, 2)
    each_route(run)


def test_a_redelivery_the_lookup_never_saw_runs_once(gw, upstream):
    def run(route, source):
        event = Event(route, source)
        # The first delivery never reached the business (the connection dropped before it acted).
        first = event.deliver(gw, {"x-demo-reset-before": "1"})
        assert first.status in (502, 503), describe(first)
        assert event.executions(upstream) == 0
        again = event.deliver(gw)
        assert again.status == 200 and again.header("idempotent-replayed") is None, describe(again)
        assert again.json()["event"] == event.id, describe(again)
        third = event.deliver(gw)
        assert third.status == 200 and third.header("idempotent-replayed") == "true", describe(third)
        time.sleep(0.3)
        assert (event.executions(upstream), event.lookups(upstream)) == (1, 1)
    each_route(run)
