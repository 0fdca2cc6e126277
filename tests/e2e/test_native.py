"""The native build (target/native/libidem_native.so, an Envoy dynamic module) in a real Envoy
1.40, whatever IDEM_ARTIFACT says: what it refuses at load and why (never a silent difference
from the .wasm), its metrics as Envoy exports a module's, the embedded store shared by all
workers of the process, and a call that outlives its request (sent from the main thread). The guarantee suites themselves run on it in `make test`
(IDEM_ARTIFACT=native, Makefile E2E_NATIVE)."""

import re
import threading

import pytest

import stack
from conftest import TEST_POLICY, TEST_ROUTES, envoy_from_yaml, new_key
from idemtest import counters, post, wait_for

CREATE = "/api/order/create"


@pytest.fixture
def native():
    """The native module, built (its Envoys name it: `wasm_path=stack.NATIVE`)."""
    stack.require_envoy()
    if not stack.NATIVE.is_file():
        pytest.fail("the native module %s does not exist; %s" % (stack.NATIVE, stack.BUILD_HINT), pytrace=False)


ROUTE = """
[[route]]
name = "create-order"
match = { method = "POST", path = "/api/order/create" }
"""

# case -> (policy, what the refusal must name: the route, the feature, the ABI call that is missing)
REFUSED = {
    "detached": (ROUTE + 'forward = "detached"\n',
                 ['route "create-order"', 'forward = "detached"', "internal listener",
                  "envoy_dynamic_module_callback_http_filter_http_callout", "Use the .wasm"]),
    "nested-metadata-scope": (ROUTE + '[route.key]\nscope = ["metadata:envoy.filters.http.jwt_authn/jwt_payload/sub"]\n',
                              ['route "create-order"', "jwt_payload/sub",
                               "envoy_dynamic_module_callback_http_get_metadata_string"]),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_the_abi_cannot_do_is_refused_at_load_with_the_reason(case, native, workdir, upstream):
    policy, reasons = REFUSED[case]
    env = stack.start_idem_envoy(workdir, upstream.port, policy, wait=False, wasm_path=stack.NATIVE)
    try:
        stack.wait_until(lambda: not env.proc.alive(), 30)
        assert not env.proc.alive(), "Envoy runs with a policy the native build cannot honour:\n%s" % env.log_tail(20)
        assert env.proc.p.returncode != 0
        lines = [l for l in env.log_text().splitlines() if "idem: invalid policy for the native build" in l]
        assert lines, "no refusal line in Envoy's log:\n%s" % env.log_tail(30)
        for reason in reasons:
            assert reason in lines[0], "the refusal does not name %r:\n%s" % (reason, lines[0])
    finally:
        env.stop()


def test_a_top_level_metadata_scope_is_read_natively(native, make_envoy, upstream):
    """What the refusal above leaves: a scope at the top of a metadata namespace, set here by Envoy's
    own header_to_metadata filter, keeps callers apart on the native build."""
    policy = ROUTE + '[route.key]\nscope = ["metadata:tenants/id"]\n'
    header_to_metadata = {
        "name": "envoy.filters.http.header_to_metadata",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config",
            "request_rules": [{"header": "x-tenant", "remove": True,
                               "on_header_present": {"metadata_namespace": "tenants", "key": "id", "type": "STRING"}}],
        },
    }
    env = make_envoy(policy, routes=stack.routes_from_policy(policy), pre_filters=[header_to_metadata],
                     wasm_path=stack.NATIVE)
    key = new_key()
    a1 = post(env, CREATE, key, headers={"x-tenant": "a"})
    a2 = post(env, CREATE, key, headers={"x-tenant": "a"})
    b1 = post(env, CREATE, key, headers={"x-tenant": "b"})
    assert a1.status == 200 and a2.status == 200 and b1.status == 200, (a1, a2, b1)
    assert upstream.calls(key) == 2, "tenants a and b share one key's record, or a's repeat ran again"
    anonymous = post(env, CREATE, key)
    assert anonymous.status == 400 and b"IDEMPOTENCY_SCOPE_MISSING" in anonymous.body, anonymous


def test_metrics_are_the_labelled_families_envoy_exports_for_a_module(native, make_envoy):
    env = make_envoy(TEST_POLICY, routes=TEST_ROUTES, wasm_path=stack.NATIVE)
    key = new_key()
    for _ in range(3):
        post(env, CREATE, key)
    assert counters(env, "create-order").get("replayed") == 2, counters(env, "create-order")
    prom = env.admin("/stats/prometheus").body.decode()
    # Envoy 1.40 prefixes a module's metrics with `envoy_<metrics_namespace>_` (it strips only
    # `wasmcustom`): the family and its labels are the .wasm's.
    assert re.search(r'^envoy_dynamicmodulescustom_idem_requests_total\{route="create-order",outcome="replayed"\} 2$',
                     prom, re.M), "\n".join(l for l in prom.splitlines() if "idem" in l)[:2000]
    assert "# TYPE envoy_dynamicmodulescustom_idem_requests_total counter" in prom


# No body read and a 30 s lock: this root ticks once a second (the lease's renewal), so only the
# ticker's own flush brings a count to Envoy sooner.
SLOW_TICKS = """
[[route]]
name = "create-order"
match = { method = "POST", path = "/api/order/create" }
[route.key]
from = "header"
name = "Idempotency-Key"
fingerprint = ["method", "path"]
lock_ttl = "30s"
"""


def test_a_count_reaches_envoy_while_another_request_of_its_worker_stays_open(native, make_envoy, upstream):
    """Natively counts are handed to Envoy in batches (Envoy 1.40 looks a labelled series up at
    each increment): at once when the worker's last stream ends, else within 20 ms from the
    ticker. One worker; a request held 3 s upstream keeps a stream open while three others
    complete: each one's `stored` shows within 0.4 s (the root's own tick, once a second, would
    let one slip past that)."""
    env = make_envoy(SLOW_TICKS, routes=TEST_ROUTES, concurrency=1, wasm_path=stack.NATIVE)
    held = threading.Thread(target=post, args=(env, CREATE, new_key("held")),
                            kwargs={"headers": {"x-demo-delay-ms": "3000"}, "timeout": 20})
    held.start()
    wait_for(lambda: counters(env, "create-order").get("forwarded") == 1, 0.4, what="the held request's `forwarded`")
    for n in range(1, 4):
        r = post(env, CREATE, new_key("quick"))
        assert r.status == 200, r
        wait_for(lambda: counters(env, "create-order").get("stored") == n, 0.4,
                 what="quick request %d's `stored` while the held one is open" % n)
    assert held.is_alive(), "the held request ended first: the test proved nothing"
    assert counters(env, "create-order").get("forwarded") == 4, counters(env, "create-order")
    held.join(20)
    assert counters(env, "create-order").get("stored") == 4, counters(env, "create-order")


def sixteen_at_once(upstream, envs, key):
    """Sends `key` 16 times at once (a barrier), in turn through each of `envs`: it runs once, and
    every answer is its 200 or a 409 while it runs."""
    barrier = threading.Barrier(16)
    answers = []

    def send(env):
        barrier.wait()
        answers.append(post(env, CREATE, key, headers={"x-demo-delay-ms": "200"}, timeout=20))
    threads = [threading.Thread(target=send, args=(envs[i % len(envs)],)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert upstream.calls(key) == 1, "a key sent 16 times at once ran %d times" % upstream.calls(key)
    statuses = sorted(a.status for a in answers)
    assert statuses.count(200) >= 1 and set(statuses) <= {200, 409}, statuses


def replayed_across(upstream, one, other):
    """A key run through `one` is replayed by `other`, and the other way round: both read and
    write the same records."""
    for first, second in ((one, other), (other, one)):
        key = new_key("across")
        a = post(first, CREATE, key)
        assert a.status == 200 and a.header("idempotent-replayed") is None, a
        b = post(second, CREATE, key)
        assert b.status == 200 and b.header("idempotent-replayed") == "true", b
        assert b.body == a.body
        assert upstream.calls(key) == 1


def test_one_key_sent_at_once_on_every_worker_runs_once(native, make_envoy, upstream):
    """The embedded store natively is process memory: a claim is atomic across Envoy's workers."""
    env = make_envoy(TEST_POLICY, routes=TEST_ROUTES, concurrency=4, wasm_path=stack.NATIVE)
    for _ in range(5):
        sixteen_at_once(upstream, [env], new_key())
    wait_for(lambda: counters(env, "create-order").get("forwarded") == 5, 5, what="5 forwarded")


def test_a_fleet_of_both_builds_shares_its_keys_through_one_redis(native, make_envoy, upstream, redis_stack):
    """A migration's fleet: a .wasm Envoy and a native Envoy on one Redis (through one Webdis), two
    workers each. A key run through either is replayed by the other, and one key sent at once
    through both runs once: the two builds write and read the same records."""
    policy = stack.redis_table(prefix="idem-mixed-%s:" % new_key("p")[-6:]) + """
[[route]]
name = "create-order"
match = { method = "POST", path = "/api/order/create" }
store = "redis"
"""
    webdis = [stack.webdis_cluster(redis_stack.webdis.port)]
    routes = stack.routes_from_policy(policy)
    wasm = make_envoy(policy, routes=routes, extra_clusters=webdis, wasm_path=stack.WASM)
    native_env = make_envoy(policy, routes=routes, extra_clusters=webdis, wasm_path=stack.NATIVE)
    replayed_across(upstream, wasm, native_env)
    sixteen_at_once(upstream, [wasm, native_env], new_key("mixed-race"))


def test_the_shipped_example_runs_on_the_native_build(native, workdir, upstream):
    """examples/envoy.yaml with the dynamic module in place of the Wasm filter (what `make demo
    ARTIFACT=native` starts): it loads, and the callback route replays a re-delivery, forwarded
    inline (the native build refuses detached, and the rewrite says so in the policy)."""
    def config(lp, ap):
        text = stack.as_native(stack.example_config_text(lp, ap, upstream.port))
        assert "envoy.filters.http.wasm.v3.Wasm" not in text and 'forward = "detached"' not in text
        return text
    with envoy_from_yaml(workdir, "envoy-example-native", config) as env:
        txn = new_key("tx")
        first = env.request("POST", "/api/pay/callback", headers={"content-type": "application/json"},
                            body={"transaction_id": txn, "status": "PAID"})
        again = env.request("POST", "/api/pay/callback", headers={"content-type": "application/json"},
                            body={"status": "PAID", "transaction_id": txn})
        assert first.status == 200 and again.status == 200, (first, again)
        assert again.header("idempotent-replayed") == "true", again
        assert again.body == first.body
        assert "dynamic_modules" in env.log_text() and "wasm log" not in env.log_text()


# The hooks Envoy 1.40's HTTP filter loader resolves as required when a config is created
# (source/extensions/filters/http/dynamic_modules/filter_config.cc); the config-level ones it
# resolves when present, and idem uses them (calls from the main thread).
REQUIRED_HOOKS = {
    "envoy_dynamic_module_on_program_init",
    "envoy_dynamic_module_on_http_filter_config_new", "envoy_dynamic_module_on_http_filter_config_destroy",
    "envoy_dynamic_module_on_http_filter_per_route_config_new",
    "envoy_dynamic_module_on_http_filter_per_route_config_destroy",
    "envoy_dynamic_module_on_http_filter_new", "envoy_dynamic_module_on_http_filter_destroy",
    "envoy_dynamic_module_on_http_filter_request_headers", "envoy_dynamic_module_on_http_filter_request_body",
    "envoy_dynamic_module_on_http_filter_request_trailers", "envoy_dynamic_module_on_http_filter_response_headers",
    "envoy_dynamic_module_on_http_filter_response_body", "envoy_dynamic_module_on_http_filter_response_trailers",
    "envoy_dynamic_module_on_http_filter_stream_complete", "envoy_dynamic_module_on_http_filter_http_callout_done",
    "envoy_dynamic_module_on_http_filter_http_stream_headers", "envoy_dynamic_module_on_http_filter_http_stream_data",
    "envoy_dynamic_module_on_http_filter_http_stream_trailers",
    "envoy_dynamic_module_on_http_filter_http_stream_complete", "envoy_dynamic_module_on_http_filter_http_stream_reset",
    "envoy_dynamic_module_on_http_filter_scheduled",
    "envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark",
    "envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark",
    "envoy_dynamic_module_on_http_filter_config_scheduled",
    "envoy_dynamic_module_on_http_filter_config_http_callout_done",
}


def dynamic_symbols(path, which):
    import subprocess
    out = subprocess.run(["nm", "-D", "--%s-only" % which, str(path)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}


def test_the_module_exports_every_hook_and_calls_only_what_envoy_exports(native):
    """The module level, as wasm_module.rs is for the .wasm: every hook Envoy's loader needs is
    exported (a missing one makes Envoy refuse the config), and every callback the bindings name is
    one the Envoy 1.40 binary exports (a misspelt binding fails at dlopen, on every request)."""
    exported = dynamic_symbols(stack.NATIVE, "defined")
    missing = REQUIRED_HOOKS - exported
    assert not missing, "hooks the module does not export: %s" % sorted(missing)
    wanted = {s for s in dynamic_symbols(stack.NATIVE, "undefined") if s.startswith("envoy_")}
    assert wanted, "the module calls no Envoy callback at all?"
    envoy = dynamic_symbols(stack.envoy_executable(), "defined")
    absent = wanted - envoy
    assert not absent, "callbacks the module needs that Envoy 1.40 does not export: %s" % sorted(absent)
    assert all(s.startswith("envoy_dynamic_module_callback_") for s in wanted), sorted(wanted)


# The same traffic on both builds: the exported series must be the same (issue 55: the same metric
# names and labels), from the zero series a config starts with to a histogram's count, and the
# decisions logged in the same words at the same levels (the same log lines).
PARITY_POLICY = """
[[route]]
name = "create-order"
match = { method = "POST", path = "/api/order/create" }

[route.key]
scope = ["header:authorization"]

[[route]]
name = "order-wait"
match = { method = "POST", path = "/api/orders/wait" }

[route.key]
on_in_flight = "wait"
"""


def exported_series(env):
    """idem's series in Envoy's Prometheus output, `{series: value}`, named as a scrape with the
    shipped job sees them (examples/prometheus/scrape-native.yml drops the native prefix). A
    histogram keeps its `_count` and its bucket bounds (`le`), not its timings."""
    out = {}
    for line in env.admin("/stats/prometheus").body.decode().splitlines():
        line = line.removeprefix("envoy_dynamicmodulescustom_")
        if not line.startswith("idem_") or line.startswith(("idem_wait_time_sum", "idem_store_call_time_sum")):
            continue
        series, _, value = line.rpartition(" ")
        if "_bucket{" in series:
            value = "bucket"  # the bound is in the series; how many fell below it is timing
        elif series == 'idem_store_call_time_count{route="order-wait"}' and value != "0":
            # A held duplicate on Redis looks the key up on a timer while it waits: how many
            # calls it made is timing (7 on one build and 8 on the other, seen once in CI).
            value = "some"
        out[series] = value
    return out


def parity_keys():
    """The keys of one run of the parity traffic, the same for both builds (so their log lines
    name the same keys and digests)."""
    return {"key": new_key("parity"), "unmatched": new_key(), "waited": new_key("parity-wait"),
            "busy": new_key("parity-busy")}


def drive_parity_traffic(env, upstream, keys):
    """Forwarded, replayed, key_reused and missing_key on a key route, a request the filter passes
    unmatched, a duplicate refused while its first is at the upstream (409), and one held
    meanwhile on a route that waits (a wait time recorded). The answers a client got, each with
    the first answer of its key: `[(answer, first)]`."""
    first, replay, reused = [post(env, CREATE, keys["key"], body=body, auth="Bearer parity")
                             for body in ({"sku": "A1", "qty": 1}, {"sku": "A1", "qty": 1}, {"sku": "B2", "qty": 9})]
    answers = [(replay, first), (reused, first), (post(env, CREATE, None, auth="Bearer parity"), first)]
    assert post(env, "/api/orders/other", keys["unmatched"]).status == 200
    for path, key, status in (("/api/orders/wait", keys["waited"], 200), (CREATE, keys["busy"], 409)):
        held, before = [], upstream.calls(key)  # the other build sent the same keys first
        slow = threading.Thread(target=lambda: held.append(post(env, path, key, auth="Bearer parity",
                                                                headers={"x-demo-delay-ms": "600"})))
        slow.start()
        wait_for(lambda: upstream.calls(key) == before + 1, 10, what="the first request of %s to reach the upstream" % key)
        duplicate = post(env, path, key, auth="Bearer parity")
        slow.join(10)
        assert duplicate.status == status and held, (duplicate, held)
        answers.append((duplicate, held[0]))
    return answers


# Headers that differ between any two answers of Envoy's (the time, the upstream's timing).
VOLATILE = {"date", "x-envoy-upstream-service-time"}


def answer_of(response, first):
    """What a client sees of an answer, to compare across builds: status, headers (the volatile
    ones dropped) and body — what a replay repeats of the first answer (its body, its
    `x-order-id`) as "the first answer's", since the upstream's answers differ from run to run,
    and a time in the body as `<time>`."""
    same = "<the first answer's>"
    firsts = dict(first.headers)
    headers = sorted((k, same if firsts.get(k) == v else v) for k, v in response.headers if k not in VOLATILE)
    body = same if response.body == first.body else re.sub(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", b"<time>", response.body)
    return (response.status, headers, body)


# A decision's log line as either build writes it: Envoy's level, then the module's own text (the
# .wasm's behind proxy-wasm's `wasm log <plugin> <root id> <vm id>: `, whose ids are empty for some).
DECISION_LINE = re.compile(r"\]\[(\w+)\]\[(?:wasm|dynamic_modules)\] (?:wasm log [^:]*: )?(idem: .*(?:route=|no policy).*)$")


def decision_lines(env):
    return sorted(" ".join(m.groups()) for m in map(DECISION_LINE.search, env.log_text().splitlines()) if m)


def test_both_builds_count_and_log_the_same_traffic_alike(native, make_envoy, upstream):
    wasm = make_envoy(PARITY_POLICY, wasm_path=stack.WASM)
    native_env = make_envoy(PARITY_POLICY, wasm_path=stack.NATIVE)
    assert_same_series(wasm, native_env, upstream)


def test_both_builds_count_and_log_the_same_traffic_alike_on_redis(native, workdir, upstream, redis_stack):
    """The same on Redis through one Webdis: the store's outcomes and `idem_store_call_time`,
    one value per Redis call, the same on both builds."""
    envs = []
    try:
        for build, path in (("wasm", stack.WASM), ("native", stack.NATIVE)):
            policy = stack.redis_table(prefix="idem-parity-%s:" % build) + PARITY_POLICY.replace(
                '[route.key]', 'store = "redis"\n\n[route.key]')
            envs.append(stack.start_idem_envoy(workdir, upstream.port, policy, wasm_path=path,
                                               extra_clusters=[stack.webdis_cluster(redis_stack.webdis.port)],
                                               name="envoy-parity-%s" % build))
        assert_same_series(*envs, upstream, store_calls=True)
    finally:
        for env in envs:
            env.stop()


def assert_same_series(wasm, native_env, upstream, store_calls=False):
    at_start = {name: exported_series(env) for name, env in (("wasm", wasm), ("native", native_env))}
    assert at_start["wasm"] == at_start["native"], "zero series differ: %s" % _difference(at_start)
    assert 'idem_requests_total{route="create-order",outcome="store_error"}' in at_start["wasm"], at_start["wasm"]
    keys = parity_keys()
    answers = {}
    for build, env in (("wasm", wasm), ("native", native_env)):
        answers[build] = [answer_of(r, first) for r, first in drive_parity_traffic(env, upstream, keys)]
    # The same answers byte for byte, headers included: the replay (what it repeats of its first
    # answer), the refused reuse of the key, the missing key, the duplicate in flight (409) and the
    # held duplicate's replay.
    assert answers["wasm"] == answers["native"], "answers differ:\nwasm   %s\nnative %s" % (
        answers["wasm"], answers["native"])
    after = {}

    def flushed():
        # Envoy merges histograms on its stats flush (every 5 s by default).
        for name, env in (("wasm", wasm), ("native", native_env)):
            after[name] = exported_series(env)
        return all(s.get('idem_wait_time_count{route="order-wait"}', "0") != "0" for s in after.values())

    wait_for(flushed, 15, interval=0.5, what="idem_wait_time_count to be flushed on both builds")
    assert after["wasm"] == after["native"], "series differ after the same traffic: %s" % _difference(after)
    for outcome, n in (("forwarded", "2"), ("replayed", "1"), ("key_reused", "1"), ("missing_key", "1"),
                       ("in_flight", "1")):
        assert after["native"].get('idem_requests_total{route="create-order",outcome="%s"}' % outcome) == n, outcome
    assert after["native"].get('idem_unmatched_total{outcome="passed"}') == "1", after["native"]
    assert after["native"].get('idem_wait_time_count{route="order-wait"}') == "1", after["native"]
    # The same decisions logged in the same words.
    lines = {"wasm": decision_lines(wasm), "native": decision_lines(native_env)}
    assert len(lines["wasm"]) >= 5, lines["wasm"]
    assert lines["wasm"] == lines["native"], "log lines differ: %s" % {
        b: sorted(set(lines[b]) - set(lines[o])) for b, o in (("wasm", "native"), ("native", "wasm"))}
    if store_calls:
        # A fresh key's claim and completion on each route, and the held duplicate's reply.
        calls = after["native"].get('idem_store_call_time_count{route="create-order"}')
        assert calls not in (None, "0"), after["native"]


def _difference(by_build):
    wasm, native = by_build["wasm"], by_build["native"]
    return {k: (wasm.get(k), native.get(k)) for k in sorted(set(wasm) | set(native)) if wasm.get(k) != native.get(k)}
