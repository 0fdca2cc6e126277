"""Behind a caller's service-mesh sidecar: a plain Envoy in front of the gateway that retries a 5xx
after 1 ms. A first attempt the service answers 500 is a definite failure, so its key is released
and the sidecar's retry runs; on Redis the release is a Webdis write, and the 500's headers used to
leave before it landed — a retry sent within a few milliseconds met the claim still held and its
client got 409 REQUEST_IN_PROGRESS instead of the retry's answer (7 of 200 at 1 ms). The release
now lands before the failure's headers go. Both stores; every client gets the retry's 200, and the
service ran each key exactly twice (the failed attempt and the retry)."""

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
"""

ROUTES = stack.routes_from_policy(POLICY.replace("{store}", ""))

# The sidecar retries a 5xx after 1 ms (Envoy's default base interval is 25 ms).
SIDECAR_ROUTES = [{"name": "to-gateway", "match": {"prefix": "/"}, "timeout": "10s", "route_options": {
    "retry_policy": {"retry_on": "5xx", "num_retries": 2,
                     "retry_back_off": {"base_interval": "0.001s", "max_interval": "0.002s"}}}}]


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
