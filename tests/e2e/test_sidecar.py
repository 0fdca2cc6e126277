"""Behind a caller's service-mesh sidecar: a plain Envoy in front of the gateway that retries a 5xx
after 1 ms, and hedges on a per-try timeout (the last two tests). A first attempt the service answers 500 is a definite failure, so its key is released
and the sidecar's retry runs; on Redis the release is a Webdis write, and the 500's headers used to
leave before it landed — a retry sent within a few milliseconds met the claim still held and its
client got 409 REQUEST_IN_PROGRESS instead of the retry's answer (7 of 200 at 1 ms). The release
now lands before the failure's headers go. Both stores; every client gets the retry's 200, and the
service ran each key exactly twice (the failed attempt and the retry)."""

import time
import uuid

import pytest

import stack
from idemtest import describe, fire

POLICY = """
[[route]]
name = "mesh-create"
match = { method = "POST", path = "/mesh/create" }
{store}
[route.key]
scope = ["header:authorization"]

[[route]]
name = "mesh-hedged-wait"
match = { method = "POST", path = "/mesh/hedged/wait" }
{store}
[route.key]
scope = ["header:authorization"]
on_in_flight = "wait"
wait_timeout = "5s"

[[route]]
name = "mesh-hedged-reject"
match = { method = "POST", path = "/mesh/hedged/reject" }
{store}
[route.key]
scope = ["header:authorization"]
unknown_outcome_hold = "1h"
"""

ROUTES = stack.routes_from_policy(POLICY.replace("{store}", ""))

# The sidecar retries a 5xx after 1 ms (Envoy's default base interval is 25 ms); on /mesh/hedged/ it
# gives each try 1 s and hedges: at a per-try timeout it sends a second try while the first goes on,
# and the first answer that is not retriable wins (the other try is cancelled).
SIDECAR_ROUTES = [
    {"name": "to-gateway-hedged", "match": {"prefix": "/mesh/hedged/"}, "timeout": "10s", "route_options": {
        "retry_policy": {"retry_on": "5xx", "num_retries": 1, "per_try_timeout": "1s"},
        "hedge_policy": {"hedge_on_per_try_timeout": True}}},
    {"name": "to-gateway", "match": {"prefix": "/"}, "timeout": "10s", "route_options": {
        "retry_policy": {"retry_on": "5xx", "num_retries": 2,
                         "retry_back_off": {"base_interval": "0.001s", "max_interval": "0.002s"}}}},
]


@pytest.fixture(params=["shared", "redis"])
def sidecar(request, make_gateway, workdir):
    store = request.param
    policy = POLICY.replace("{store}", 'store = "redis"' if store == "redis" else "")
    if store == "redis":
        policy = stack.redis_table(prefix="idem-mesh-%s:" % uuid.uuid4().hex[:6]) + policy
    gateway = make_gateway(store, policy, ROUTES)
    try:
        mesh = stack.start_idem_envoy(workdir, gateway.listen_port, "", routes=SIDECAR_ROUTES, with_filter=False,
                                      name="envoy-sidecar")
    except stack.StackError as e:
        pytest.fail(str(e), pytrace=False)
    yield mesh, gateway
    mesh.stop()


def test_a_retry_sent_the_instant_a_500_arrives_runs(sidecar, upstream):
    mesh, gateway = sidecar
    keys = ["mesh-" + uuid.uuid4().hex for _ in range(200)]

    def create(key):
        return mesh.request("POST", "/mesh/create", headers={"idempotency-key": key, "x-demo-fail-first": "1"},
                            body={"sku": "A1"}, timeout=15)
    answers = []
    for start in range(0, len(keys), 20):
        batch = keys[start:start + 20]
        answers += fire(len(batch), lambda i, batch=batch: create(batch[i]))
    wrong = [(k, describe(r)) for k, r in zip(keys, answers) if r.status != 200 or r.json().get("n") != 2]
    assert not wrong, "%d of 200 clients did not get the retry's answer, e.g. %s" % (len(wrong), wrong[:3])
    runs = [upstream.calls(key=k) for k in keys]
    assert runs == [2] * 200, "executions per key other than 2: %s" % sorted(set(runs))


def test_a_hedged_try_waits_for_the_first_and_the_client_gets_its_answer(sidecar, upstream):
    """The service takes 1.5 s, the sidecar's per-try timeout is 1 s: it hedges a second try with
    the same key. With `on_in_flight = "wait"` the hedge is held until the first try's answer, the
    first answer wins, and the business ran once."""
    mesh, gateway = sidecar
    key = "hedge-" + uuid.uuid4().hex
    r = mesh.request("POST", "/mesh/hedged/wait", headers={"idempotency-key": key, "x-demo-delay-ms": "1500"},
                     body={"sku": "A1"}, timeout=15)
    assert r.status == 200 and r.json()["n"] == 1, describe(r)
    # The hedge is a retry to Envoy (the first try goes on, so no per-try timeout is counted).
    assert mesh.stats("cluster.demo_upstream.").get("cluster.demo_upstream.upstream_rq_retry", 0) == 1, \
        "the sidecar hedged once: %s" % mesh.stats("cluster.demo_upstream.upstream_rq_retry")
    time.sleep(0.5)  # a second execution would have started by now
    assert upstream.calls(key=key) == 1


def test_a_hedged_try_rejected_in_progress_wins_and_leaves_an_unknown_outcome(sidecar, upstream):
    """The pitfall docs/clients.md names: with `on_in_flight = "reject"` the hedge gets 409
    REQUEST_IN_PROGRESS at once, the sidecar returns it (not retriable) and cancels the first try,
    which ran: the key is held as an unknown outcome, and the business ran once."""
    mesh, gateway = sidecar
    key = "hedge-" + uuid.uuid4().hex
    r = mesh.request("POST", "/mesh/hedged/reject", headers={"idempotency-key": key, "x-demo-delay-ms": "1500"},
                     body={"sku": "A1"}, timeout=15)
    assert (r.status, r.code) == (409, "REQUEST_IN_PROGRESS"), describe(r)
    assert mesh.stats("cluster.demo_upstream.").get("cluster.demo_upstream.upstream_rq_retry", 0) == 1
    time.sleep(1.0)  # the cancelled first try's business finishes
    assert upstream.calls(key=key) == 1
    again = gateway.request("POST", "/mesh/hedged/reject", headers={"idempotency-key": key}, body={"sku": "A1"})
    assert (again.status, again.code) == (409, "IDEMPOTENCY_OUTCOME_UNKNOWN"), describe(again)
    assert upstream.calls(key=key) == 1
