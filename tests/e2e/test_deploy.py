"""Deploying through a control plane: the Envoy configuration Istio, Envoy Gateway and Higress
generate from examples/istio/, examples/envoy-gateway/ and examples/higress/ (written out as each
translator does, scripts/stack/control_planes.py) runs in real Envoy 1.40 with the built filter.

Without `allow_on_headers_stop_iteration` (what a WasmPlugin or an EnvoyExtensionPolicy gives),
no request hangs: routes deciding at the headers work exactly once, routes needing the body are
answered 500 IDEMPOTENCY_MISCONFIGURED at once. With the patch each example ships, the body
routes work exactly once too.
"""

import copy
import time
import uuid

import pytest

import stack
from conftest import new_key
from idemtest import assert_local, assert_replay_of, assert_upstream_answer, describe, fire, post
from stack import control_planes as cp

ROUTES = [
    {"name": "create-order", "match": {"path": "/api/order/create"}},
    {"name": "pay-callback", "match": {"path": "/api/pay/callback"}},
    {"name": "other", "match": {"prefix": "/"}},
]
ISTIO = cp.EXAMPLES / "istio"
EG = cp.EXAMPLES / "envoy-gateway"
HIGRESS = cp.EXAMPLES / "higress"
FIX_HINT = "allow_on_headers_stop_iteration: true"


@pytest.fixture
def gateway(workdir, upstream, request):
    """Starts Envoy with the given HTTP filter (as a control plane generated it)."""
    started = []

    def start(http_filter, per_route_enable=None, wait=True, extra_clusters=()):
        listen, admin = stack.free_port(), stack.free_port()
        cfg = cp.gateway_config(http_filter, listen_port=listen, admin_port=admin, upstream_port=upstream.port,
                                routes=ROUTES, per_route_enable=per_route_enable, extra_clusters=extra_clusters)
        env = stack.Envoy(cfg, workdir, name="envoy-deploy")
        started.append(env)
        if wait:
            try:
                env.wait_ready(60)
            except stack.StackError as e:
                pytest.fail(str(e), pytrace=False)
        return env

    yield start
    for env in started:
        if getattr(getattr(request.node, "rep_call", None), "failed", False):
            print("\n--- Envoy log tail (%s) ---\n%s" % (env.config_path, env.log_tail(40)))
        env.stop()


def callback(env, tx, delay_ms=0, timeout=10.0):
    headers = {"x-demo-delay-ms": str(delay_ms)} if delay_ms else {}
    return post(env, "/api/pay/callback", body={"transaction_id": tx, "amount": 100}, headers=headers,
                timeout=timeout)


def assert_header_route_runs_once(env, upstream):
    key = new_key("deploy")
    answers = fire(30, lambda i: post(env, "/api/order/create", key, headers={"x-demo-delay-ms": "300"}, timeout=30))
    fresh = [r for r in answers if r.status == 200 and r.header("idempotent-replayed") is None]
    assert len(fresh) == 1, [describe(r) for r in answers[:3]]
    for r in answers:
        if r is not fresh[0]:
            assert r.status == 409 or r.header("idempotent-replayed") == "true", describe(r)
    assert upstream.calls(key) == 1
    assert_replay_of(post(env, "/api/order/create", key), fresh[0])


def assert_body_route_runs_once(env, upstream):
    tx = "tx-%s" % uuid.uuid4().hex
    answers = fire(30, lambda i: callback(env, tx, delay_ms=300, timeout=30))
    fresh = [r for r in answers if r.status == 200 and r.header("idempotent-replayed") is None]
    assert len(fresh) == 1, [describe(r) for r in answers[:3]]
    assert upstream.calls(transaction_id=tx) == 1
    assert_replay_of(callback(env, tx), fresh[0])


def assert_body_route_refused_promptly(env, upstream):
    """Flag off: the body route is answered at once with what is wrong, nothing forwarded."""
    for _ in range(3):
        tx = "tx-%s" % uuid.uuid4().hex
        t0 = time.monotonic()
        r = callback(env, tx, timeout=5)
        took = time.monotonic() - t0
        assert_local(r, 500, "IDEMPOTENCY_MISCONFIGURED")
        assert took < 1.0, "the misconfigured answer took %.2fs" % took
        assert "allow_on_headers_stop_iteration" in r.json()["message"], describe(r)
        assert upstream.calls(transaction_id=tx) == 0
    logs = [l for l in env.log_text().splitlines() if FIX_HINT in l]
    assert logs and len(logs) <= 2, "one error line per worker saying what to change: %s" % logs
    assert "[error]" in logs[0], logs[0]


def test_istio_wasmplugin_without_the_flag_never_hangs(gateway, upstream):
    doc = cp.load_yaml(ISTIO / "wasmplugin.yaml")
    f = cp.istio_wasmplugin_filter(doc)
    cfg = f["typed_config"]["config"]
    # The shape Istio generates: any root_id, no vm_id, no flag, the bundle as protojson.
    assert "vm_id" not in cfg["vm_config"] and "allow_on_headers_stop_iteration" not in cfg
    assert cfg["name"] == "istio-system.idem" and cfg["configuration"]["value"].startswith("{")
    env = gateway(f)
    assert_header_route_runs_once(env, upstream)
    assert_body_route_refused_promptly(env, upstream)
    # Requests no policy matches pass untouched.
    r = env.request("POST", "/elsewhere", headers={"content-type": "application/json"}, body=b"{}")
    assert r.status == 200, describe(r)


def test_istio_wasmplugin_without_the_flag_on_redis_resumes_after_the_store_answers(gateway, upstream, redis_stack):
    """The Redis path pauses at the headers for its Webdis call and resumes: that works without
    the flag too (Envoy buffers the body meanwhile and forwards it on resume)."""
    doc = cp.load_yaml(ISTIO / "wasmplugin.yaml")
    bundle = doc["spec"]["pluginConfig"]
    bundle["redis"] = {"cluster": "webdis", "authority": "webdis", "basic_auth": stack.WEBDIS_AUTH,
                       "timeout": "1s", "prefix": "idem-deploy-%s:" % uuid.uuid4().hex[:6]}
    for route in bundle["route"]:
        route["store"] = "redis"
    env = gateway(cp.istio_wasmplugin_filter(doc), extra_clusters=[stack.webdis_cluster(redis_stack.webdis.port)])
    assert_header_route_runs_once(env, upstream)
    assert_body_route_refused_promptly(env, upstream)


def test_istio_envoyfilter_with_the_flag_runs_body_routes_exactly_once(gateway, upstream):
    f = cp.istio_envoyfilter_filter(cp.load_yaml(ISTIO / "envoyfilter.yaml"))
    assert f["typed_config"]["config"]["allow_on_headers_stop_iteration"] is True
    assert "vm_id" not in f["typed_config"]["config"]["vm_config"]
    env = gateway(f)
    assert_body_route_runs_once(env, upstream)
    assert_header_route_runs_once(env, upstream)
    assert not [l for l in env.log_text().splitlines() if FIX_HINT in l]


def test_envoy_gateway_policy_then_the_patch_policy(gateway, upstream):
    f = cp.envoy_gateway_filter(cp.load_yaml(EG / "extension-policy.yaml"))
    assert f["name"] == "envoy.filters.http.wasm/envoyextensionpolicy/default/idem/wasm/0"
    env = gateway(f, per_route_enable=f["name"])
    assert_header_route_runs_once(env, upstream)
    assert_body_route_refused_promptly(env, upstream)
    env.stop()
    # The EnvoyPatchPolicy sets the flag on exactly that filter.
    listen, admin = stack.free_port(), stack.free_port()
    cfg = cp.gateway_config(f, listen_port=listen, admin_port=admin, upstream_port=upstream.port, routes=ROUTES,
                            per_route_enable=f["name"])
    cp.apply_envoy_patch_policy(cfg["static_resources"]["listeners"][0], cp.load_yaml(EG / "patch-policy.yaml"))
    patched = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert patched["http_filters"][0]["typed_config"]["config"]["allow_on_headers_stop_iteration"] is True
    env = gateway(patched["http_filters"][0], per_route_enable=f["name"])
    assert_body_route_runs_once(env, upstream)
    assert_header_route_runs_once(env, upstream)


def test_a_patch_policy_that_misses_its_filter_is_an_error():
    doc = cp.load_yaml(EG / "patch-policy.yaml")
    doc["spec"]["jsonPatches"][0]["operation"]["jsonPath"] = "..http_filters[?(@.name=='nope')].typed_config.config"
    f = cp.envoy_gateway_filter(cp.load_yaml(EG / "extension-policy.yaml"))
    cfg = cp.gateway_config(f, listen_port=1, admin_port=2, upstream_port=3, routes=ROUTES)
    with pytest.raises(stack.StackError, match="matched no filter"):
        cp.apply_envoy_patch_policy(cfg["static_resources"]["listeners"][0], doc)


def test_envoy_gateway_dynamic_module_runs_body_routes_exactly_once_without_a_patch(gateway, upstream):
    """The native build through Envoy Gateway (examples/envoy-gateway/native/): the module the
    EnvoyProxy registers, loaded by name as in the pod, runs the .wasm example's policies, and the
    body route works as it is: a dynamic module may hold a request at its headers, so nothing
    needs the EnvoyPatchPolicy the .wasm needs."""
    if not stack.NATIVE.is_file():
        pytest.fail("the native module %s does not exist; %s" % (stack.NATIVE, stack.BUILD_HINT), pytrace=False)
    policy = cp.load_yaml(EG / "native" / "extension-policy.yaml")
    proxy = cp.load_yaml(EG / "native" / "envoy-proxy.yaml")
    # The stack's Envoys find modules where make builds them; the example names that module.
    assert proxy["spec"]["dynamicModules"][0]["libraryName"] == stack.NATIVE_MODULE
    assert policy["spec"]["dynamicModule"][0]["config"] == \
        cp.load_yaml(EG / "extension-policy.yaml")["spec"]["wasm"][0]["config"], "the same policies as the .wasm example"
    f = cp.envoy_gateway_dynamic_module_filter(policy, proxy)
    assert f["name"] == "envoy.filters.http.dynamic_modules/envoyextensionpolicy/default/idem/dynamic-module/0"
    env = gateway(f, per_route_enable=f["name"])
    loaded = [l for l in env.log_text().splitlines() if "idem: plugin" in l and "loaded" in l]
    assert loaded and all("[dynamic_modules]" in l and 'plugin "idem"' in l for l in loaded), loaded
    assert_header_route_runs_once(env, upstream)
    assert_body_route_runs_once(env, upstream)
    assert_upstream_answer(post(env, "/healthz", None))


def test_an_envoy_gateway_dynamic_module_outside_the_allowlist_is_refused():
    policy = cp.load_yaml(EG / "native" / "extension-policy.yaml")
    proxy = cp.load_yaml(EG / "native" / "envoy-proxy.yaml")
    proxy["spec"]["dynamicModules"][0]["name"] = "other"
    with pytest.raises(stack.StackError, match="not registered in the EnvoyProxy dynamicModules allowlist"):
        cp.envoy_gateway_dynamic_module_filter(policy, proxy)


def test_higress_default_config_runs_and_match_rules_are_refused_with_the_fix(gateway, upstream):
    doc = cp.load_yaml(HIGRESS / "wasmplugin.yaml")
    env = gateway(cp.higress_filter(doc))
    assert_header_route_runs_once(env, upstream)
    env.stop()
    with_rules = copy.deepcopy(doc)
    with_rules["spec"]["matchRules"] = [{"ingress": ["default/orders"], "config": {"route": []}}]
    env = gateway(cp.higress_filter(with_rules), wait=False)
    stack.wait_until(lambda: not env.proc.alive() or "_rules_" in env.log_text(), 30)
    lines = [l for l in env.log_text().splitlines() if "idem: invalid policy" in l]
    assert lines and "`_rules_` (Higress matchRules) is not supported" in lines[0], env.log_tail(20)
    assert "defaultConfig" in lines[0]


def test_two_idem_plugins_without_vm_id_keep_their_keys_apart(workdir, upstream, gateway):
    """Two WasmPlugins (no vm_id: one shared-data namespace in Envoy) in one chain: each keeps to
    its own buckets (namespace = its plugin name), so the second never sees the first's claim."""
    doc = cp.load_yaml(ISTIO / "wasmplugin.yaml")
    second = copy.deepcopy(doc)
    second["metadata"]["name"] = "idem-copy"
    second["spec"].pop("pluginName")  # Istio's root_id is then empty: any root_id works
    a, b = cp.istio_wasmplugin_filter(doc), cp.istio_wasmplugin_filter(second)
    listen, admin = stack.free_port(), stack.free_port()
    cfg = cp.gateway_config(a, listen_port=listen, admin_port=admin, upstream_port=upstream.port, routes=ROUTES)
    cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"].insert(1, b)
    env = stack.Envoy(cfg, workdir, name="envoy-two-plugins")
    try:
        env.wait_ready(60)
        key = new_key("two")
        first = post(env, "/api/order/create", key)
        assert_upstream_answer(first, key=key, n=1)
        assert_replay_of(post(env, "/api/order/create", key), first)
        assert upstream.calls(key) == 1
        namespaces = sorted(set(l.split("in namespace ")[1].strip() for l in env.log_text().splitlines()
                                if "in namespace " in l))
        assert namespaces == ["istio-system.idem", "istio-system.idem-copy"], namespaces
    finally:
        env.stop()
