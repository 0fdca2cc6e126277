"""CloudEvents pushed over HTTP, built with the PyPI `cloudevents` SDK, through real Envoy on both
stores with the shipped policy (policies/cloudevents-push.toml): binary and structured events
re-delivered as brokers do (a new `time` and `traceparent` each time) run once and get the first
reply; the same id from two sources is two events; a consumer failure lets the re-delivery run; a
consumer slower than the broker ends in a 2xx; a batch is refused (415), never deduplicated whole.
The consumer (sdk/merchant.py `/events`) reads every event with the SDK's `from_http`."""

import dataclasses
import json
import sys
import uuid

import pytest

import stack
from idemtest import assert_local, assert_replay_of, describe, wait_for

# The native build refuses this module's policy at load.
pytestmark = pytest.mark.wasm_only("forward = \"detached\" (policies/cloudevents-push.toml)")

sys.path.insert(0, str(stack.REPO / "tests" / "e2e" / "sdk"))

from cloudevents.core.bindings.http import to_binary, to_structured  # noqa: E402
from cloudevents.core.formats.json import JSONFormat  # noqa: E402
from cloudevents.core.v1.event import CloudEvent  # noqa: E402
from merchant import Merchant  # noqa: E402

ROUTES = [{"name": "events", "match": {"path": "/events"}, "idem": True, "timeout": "30s"}]
FMT = JSONFormat()


def policy(store, prefix):
    text = (stack.REPO / "policies" / "cloudevents-push.toml").read_text()
    if store == "shared":
        return text
    return stack.redis_table(prefix=prefix) + text.replace('name = "cloudevents-push"\n',
                                                           'name = "cloudevents-push"\nstore = "redis"\n')


@pytest.fixture(scope="module")
def consumer():
    m = Merchant()
    yield m
    m.stop()


PREFIX = "idem-ce-%s:" % uuid.uuid4().hex[:6]


@pytest.fixture(params=["shared", "redis"])
def gateway(request, module_gateway, consumer):
    """One gateway per store for the module: every test uses its own ids."""
    return module_gateway(request.param, policy(request.param, PREFIX), ROUTES, upstream_port=consumer.port)


def event(event_id, source="/shop/eu", data=None):
    """One delivery of an event, as a broker sends it: a new `time` and a new trace each time."""
    return CloudEvent(attributes={
        "type": "com.example.order.paid", "source": source, "id": event_id,
        "datacontenttype": "application/json",
        "traceparent": "00-%s-%s-01" % (uuid.uuid4().hex, uuid.uuid4().hex[:16]),
    }, data=data if data is not None else {"order": 7, "amount": 100})


def push(env, message, timeout=10.0):
    headers = dict(message.headers)
    headers.setdefault("content-type", "application/json")
    return env.request("POST", "/events", headers=headers, body=message.body, timeout=timeout, anonymous=True)


@pytest.mark.parametrize("mode", [to_binary, to_structured], ids=["binary", "structured"])
def test_an_event_redelivered_three_times_runs_once_and_gets_the_first_reply(gateway, consumer, mode):
    eid = str(uuid.uuid4())
    messages = [mode(event(eid), FMT) for _ in range(4)]
    if mode is to_structured:
        assert len({m.body for m in messages}) == 4, "each delivery's envelope differs (time, traceparent)"
    first = push(gateway, messages[0])
    assert first.status == 200 and first.json()["accepted"] == eid, describe(first)
    for m in messages[1:]:
        assert_replay_of(push(gateway, m), first)
    assert consumer.calls("/shop/eu " + eid) == 1


def test_the_same_id_from_two_sources_is_two_events_in_either_mode(gateway, consumer):
    eid = str(uuid.uuid4())
    eu = push(gateway, to_structured(event(eid, "/shop/eu"), FMT))
    us = push(gateway, to_binary(event(eid, "/shop/us"), FMT))
    assert eu.status == 200 and us.status == 200 and us.header("idempotent-replayed") is None, describe(us)
    assert (eu.json()["source"], us.json()["source"]) == ("/shop/eu", "/shop/us")
    assert consumer.calls("/shop/eu " + eid) == 1 and consumer.calls("/shop/us " + eid) == 1
    # The same event's other mode is a replay: it is one event.
    assert_replay_of(push(gateway, to_binary(event(eid, "/shop/eu"), FMT)), eu)
    # The same id with other data is refused, not replayed.
    other = push(gateway, to_structured(event(eid, "/shop/eu", data={"order": 8}), FMT))
    assert_local(other, 422, "IDEMPOTENCY_KEY_REUSED")
    # Data compared by exact value, never through floating point: two 20-digit amounts that one
    # f64 cannot tell apart are two events' data (a 422), the same amount in the other mode and
    # spelt 1.2345678901234567890e19 is the same data (a replay).
    big = str(uuid.uuid4())
    paid = push(gateway, to_structured(event(big, "/shop/eu", data={"amount": 12345678901234567890}), FMT))
    assert paid.status == 200, describe(paid)
    off_by_one = push(gateway, to_binary(event(big, "/shop/eu", data={"amount": 12345678901234567891}), FMT))
    assert_local(off_by_one, 422, "IDEMPOTENCY_KEY_REUSED")
    spelt = to_binary(event(big, "/shop/eu", data={"amount": 1}), FMT)
    spelt = dataclasses.replace(spelt, body=b'{"amount": 1.2345678901234567890e19}')
    assert_replay_of(push(gateway, spelt), paid)


def test_a_consumer_failure_lets_the_redelivery_run(gateway, consumer):
    eid = str(uuid.uuid4())
    consumer.fail_first.add("/shop/eu " + eid)
    first = push(gateway, to_binary(event(eid), FMT))
    assert first.status == 500, describe(first)
    again = push(gateway, to_binary(event(eid), FMT))
    assert again.status == 200 and again.json()["n"] == 2, describe(again)
    assert_replay_of(push(gateway, to_structured(event(eid), FMT)), again)
    assert consumer.calls("/shop/eu " + eid) == 2


def test_a_consumer_slower_than_the_broker_ends_in_a_2xx(gateway, consumer):
    eid = str(uuid.uuid4())
    consumer.slow["/shop/eu " + eid] = 2.5
    with pytest.raises(OSError):  # the broker's delivery timeout (here 1 s)
        push(gateway, to_binary(event(eid), FMT), timeout=1.0)
    wait_for(lambda: consumer.calls("/shop/eu " + eid) == 1, 5, what="the event to reach the consumer")
    again = push(gateway, to_binary(event(eid), FMT), timeout=10.0)  # held until the consumer answered
    assert again.status == 200 and again.header("idempotent-replayed") == "true", describe(again)
    assert again.json()["accepted"] == eid
    assert consumer.calls("/shop/eu " + eid) == 1


def test_a_batch_is_refused_never_deduplicated_whole(gateway, consumer):
    ids = [str(uuid.uuid4()) for _ in range(2)]
    body = ("[" + ",".join(FMT.write(event(i)).decode() for i in ids) + "]").encode()
    r = gateway.request("POST", "/events", headers={"content-type": "application/cloudevents-batch+json"},
                        body=body, anonymous=True)
    j = assert_local(r, 415, "IDEMPOTENCY_MEDIA_TYPE_UNSUPPORTED")
    assert "one per request" in j["message"], describe(r)
    assert all(consumer.calls("/shop/eu " + i) == 0 for i in ids)
    assert json.loads(body)[0]["id"] == ids[0]
