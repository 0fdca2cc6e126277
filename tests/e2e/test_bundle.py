"""`idem-lint bundle policies/ --envoy-filter` loads in real Envoy and every policy of policies/ answers.

The http_filters entry is the command's output, byte for byte (only indented to its place in the
HTTP connection manager); the rest of the bootstrap comes from scripts/stack/envoy_config.py. The
linter is target/debug/idem-lint (`cargo build -p idem-lint`; `make e2e` builds it, and `cargo test`
already has), or $IDEM_LINT; a missing binary is a failure, never a skip.
"""

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

import stack
from conftest import envoy_from_yaml, new_key
from idemtest import assert_local, assert_replay_of, assert_upstream_answer, describe, post, wait_for

IDEM_LINT = Path(os.environ.get("IDEM_LINT") or stack.REPO / "target" / "debug" / "idem-lint")

# One Envoy route per policy of policies/, each with the filter switched on, plus a catch-all without.
ROUTES = [
    {"name": "create-order", "match": {"path": "/api/order/create"}, "idem": True},
    {"name": "pay-callback", "match": {"path": "/api/pay/callback"}, "idem": True},
    {"name": "orders", "match": {"prefix": "/api/orders/"}, "idem": True},
    {"name": "token-issue", "match": {"path": "/api/idempotent/token"}, "idem": True},
    {"name": "submit-form", "match": {"path": "/api/form/submit"}, "idem": True},
    {"name": "webhook-events", "match": {"path": "/api/webhooks/events"}, "idem": True},
    {"name": "internal-transfer", "match": {"path": "/api/internal/transfers"}, "idem": True},
    {"name": "reconcile-job", "match": {"path": "/api/jobs/reconcile"}, "idem": True},
    {"name": "passthrough", "match": {"prefix": "/"}, "idem": False},
]


# The build `idem-lint envoy` loads in this pass: the native build under IDEM_ARTIFACT=native
# (make test's native pass), else the .wasm.
BUILD = ["--native", str(stack.NATIVE)] if stack.ARTIFACT == "native" else ["--wasm", str(stack.WASM)]


def bundle_entry(files=None, build=("--wasm", str(stack.WASM))):
    """`idem-lint bundle <files> --envoy-filter <build>`'s output (the shipped policies by default)."""
    if not IDEM_LINT.is_file():
        pytest.fail("%s is missing: build it with `cargo build -p idem-lint` (or set IDEM_LINT to a built idem-lint)"
                    % IDEM_LINT, pytrace=False)
    r = subprocess.run([str(IDEM_LINT), "bundle", *(files or stack.shipped_policies()), "--envoy-filter", *build],
                       cwd=str(stack.REPO), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, "idem-lint bundle failed (%d): %s" % (r.returncode, r.stderr)
    assert r.stdout.lstrip("#").strip(), r.stdout
    return r.stdout


def envoy_yaml(entry, listen_port, admin_port, upstream_port):
    """A bootstrap in YAML: stack's pieces as JSON flow values (JSON is YAML), the entry as printed."""
    j = json.dumps
    routes = [stack.route_entry(r) for r in ROUTES]
    indented = "".join(("          " + line if line.strip() else "") + "\n" for line in entry.splitlines())
    return (
        "admin: %s\n" % j({"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}})
        + "bootstrap_extensions: %s\n" % j([stack.INTERNAL_LISTENER_EXTENSION])
        + "static_resources:\n"
        + "  clusters: %s\n" % j([stack.cluster("demo_upstream", upstream_port), stack.reentry_cluster()])
        + "  listeners:\n"
        + "  - name: ingress\n"
        + "    address: %s\n" % j({"socket_address": {"address": "127.0.0.1", "port_value": listen_port}})
        + "    filter_chains:\n"
        + "    - filters:\n"
        + "      - name: envoy.filters.network.http_connection_manager\n"
        + "        typed_config:\n"
        + '          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3'
          '.HttpConnectionManager\n'
        + "          stat_prefix: ingress\n"
        + "          codec_type: AUTO\n"
        + "          route_config: %s\n" % j({"name": "ingress_routes", "virtual_hosts": [
            {"name": "api", "domains": ["*"], "routes": routes}]})
        + "          http_filters:\n"
        + indented
        + "          - name: envoy.filters.http.router\n"
        + '            typed_config: {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}\n'
        # Detached routes (pay-callback, the provider callbacks) re-enter through this listener.
        + "  - %s\n" % j(stack.reentry_listener(routes))
    )


@pytest.fixture
def bundled(workdir, upstream):
    entry = bundle_entry()
    with envoy_from_yaml(workdir, "envoy-bundle", lambda lp, ap: envoy_yaml(entry, lp, ap, upstream.port)) as env:
        yield env


@pytest.mark.wasm_only('forward = "detached" (pay-callback, among the shipped policies; the entry is the .wasm\'s)')
def test_bundle_envoy_filter_entry_loads_and_every_policy_answers(bundled, upstream):
    env = bundled
    # create-order (key mode, header): missing key, first request, replay
    assert_local(post(env, "/api/order/create", None), 400, "IDEMPOTENCY_KEY_MISSING")
    key = new_key()
    first = post(env, "/api/order/create", key)
    assert_upstream_answer(first, key=key, n=1)
    assert_replay_of(post(env, "/api/order/create", key), first)

    # pay-callback (body /transaction_id): the first SUCCESS is replayed to the provider
    txn = new_key("tx")
    cb = post(env, "/api/pay/callback", body={"transaction_id": txn, "status": "PAID"})
    assert cb.status == 200 and cb.json()["code"] == "SUCCESS", describe(cb)
    assert_replay_of(post(env, "/api/pay/callback", body={"status": "PAID", "transaction_id": txn}), cb)
    assert upstream.calls(transaction_id=txn) == 1

    # order-pay (path template)
    assert_local(post(env, "/api/orders/7/pay", None), 400, "IDEMPOTENCY_KEY_MISSING")

    # webhook-events (message id header): a redelivery is replayed, handled once
    wid = new_key("msg")
    w1 = post(env, "/api/webhooks/events", headers={"webhook-id": wid}, body={"type": "paid", "data": {}})
    assert w1.status == 200, describe(w1)
    assert_replay_of(post(env, "/api/webhooks/events", headers={"webhook-id": wid},
                          body={"type": "paid", "data": {}}), w1)

    # internal-transfer (Idempotency-Key scoped to the calling service)
    tk = new_key("tr")
    t1 = post(env, "/api/internal/transfers", tk, headers={"x-caller-service": "ledger"},
              body={"from_account": "a", "to_account": "b", "amount": 100})
    assert_upstream_answer(t1, key=tk, n=1)
    assert_replay_of(post(env, "/api/internal/transfers", tk, headers={"x-caller-service": "ledger"},
                          body={"from_account": "a", "to_account": "b", "amount": 100}), t1)

    # reconcile-job (on_completed = "reject"): a second trigger gets 409 RECONCILE_ALREADY_RUNNING
    merchant = new_key("m")
    rk = "reconcile:%s:2024-05-01" % merchant
    job = {"merchant_id": merchant, "bill_date": "2024-05-01"}
    r1 = post(env, "/api/jobs/reconcile", rk, body=job)
    assert_upstream_answer(r1, key=rk, n=1)
    j = assert_local(post(env, "/api/jobs/reconcile", rk, body=job), 409, "RECONCILE_ALREADY_RUNNING")
    assert j["message"] == "对账任务已存在", j

    # submit-form (token mode): issue, submit, double submit -> 409 请勿重复提交
    auth = {"authorization": "Bearer bundle"}
    issued = env.request("POST", "/api/idempotent/token", headers=auth, body=b"")
    assert issued.status == 200 and issued.code == "TOKEN_ISSUED", describe(issued)
    token = issued.json()["token"]
    h = dict(auth, **{"Idempotency-Token": token, "content-type": "application/json"})
    s1 = env.request("POST", "/api/form/submit", headers=h, body=b'{"title":"hello"}')
    assert_upstream_answer(s1)
    j = assert_local(env.request("POST", "/api/form/submit", headers=h, body=b'{"title":"hello"}'),
                     409, "DUPLICATE_REQUEST")
    assert j["message"] == "请勿重复提交", j

    # no policy, no filter
    assert_upstream_answer(post(env, "/healthz", None))


# The shipped policies both builds serve (the others forward detached: the native build refuses them).
INLINE_POLICIES = ["policies/create-order.toml", "policies/order-pay.toml", "policies/internal-transfer.toml",
                   "policies/reconcile-job.toml", "policies/submit-form.toml"]


def test_the_entry_for_this_passs_build_loads_and_its_policies_answer(workdir, upstream):
    """The --envoy-filter entry of the build under test (`--native` in the native pass: a
    DynamicModuleFilter naming the module), pasted into a bootstrap: Envoy loads it and the policies
    answer. In the native pass the Envoy must log the module's load, so the .wasm cannot stand in."""
    entry = bundle_entry(INLINE_POLICIES, BUILD)
    with envoy_from_yaml(workdir, "envoy-entry", lambda lp, ap: envoy_yaml(entry, lp, ap, upstream.port)) as env:
        key = new_key()
        first = post(env, "/api/order/create", key)
        assert_upstream_answer(first, key=key, n=1)
        assert_replay_of(post(env, "/api/order/create", key), first)
        assert_local(post(env, "/api/orders/7/pay", None), 400, "IDEMPOTENCY_KEY_MISSING")
        tk = new_key("tr")
        body = {"from_account": "a", "to_account": "b", "amount": 100}
        t1 = post(env, "/api/internal/transfers", tk, headers={"x-caller-service": "ledger"}, body=body)
        assert_upstream_answer(t1, key=tk, n=1)
        # Another calling service's key space: the same key is its own first request.
        t2 = post(env, "/api/internal/transfers", tk, headers={"x-caller-service": "billing"}, body=body)
        assert_upstream_answer(t2, key=tk, n=2)
        assert_upstream_answer(post(env, "/healthz", None))
        # The plugin's load line says which host runs it: `[dynamic_modules]` natively, `[wasm]` else.
        loaded = [l for l in env.log_text().splitlines() if "idem: plugin" in l and "loaded" in l]
        assert loaded, env.log_tail(20)
        native = stack.ARTIFACT == "native"
        assert all(("[dynamic_modules]" in l) == native for l in loaded), loaded
        assert ("envoy.wasm.runtime.v8" in entry) != native, entry


def test_a_policy_per_route_on_redis_bundles_and_runs_on_two_envoys(workdir, upstream, redis_stack, tmp_path):
    """Two Redis route files and `[redis]` in a file of its own (issue 40): `idem-lint bundle DIR`
    composes them, and two Envoys sharing one Redis run the bundle: forwarded once, replayed on
    either Envoy."""
    prefix = "idem-compose-%s:" % new_key()[-6:]
    (tmp_path / "redis.toml").write_text(stack.redis_table(prefix=prefix))
    for name, path in (("create-payout", "/payouts"), ("create-refund", "/refunds")):
        (tmp_path / ("%s.toml" % name)).write_text(
            '[[route]]\nname = "%s"\nmatch = { method = "POST", path = "%s" }\nstore = "redis"\n' % (name, path))
    r = subprocess.run([str(IDEM_LINT), "bundle", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    routes = stack.routes_from_policy(r.stdout)
    try:
        envs = stack.start_fleet(workdir, upstream.port, redis_stack.webdis.port, r.stdout, routes=routes, n=2)
    except stack.StackError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        for path in ("/payouts", "/refunds"):
            key = new_key("compose")
            first = post(envs[0], path, key)
            assert_upstream_answer(first, key=key, n=1)
            assert_replay_of(post(envs[1], path, key), first)
            assert upstream.calls(key) == 1
    finally:
        for env in envs:
            env.stop()


def generated_envoy(workdir, paths, upstream_port, webdis_port=None):
    """`idem-lint envoy PATHS --upstream … [--webdis …]` as printed, run by a real Envoy."""
    def config(lp, ap):
        argv = [str(IDEM_LINT), "envoy", *[str(p) for p in paths], "--upstream", "127.0.0.1:%d" % upstream_port,
                "--listen", str(lp), "--admin", str(ap), *BUILD,
                "--listeners", str(workdir / ("idem-listeners-%d.json" % lp))]
        if webdis_port:
            argv += ["--webdis", "127.0.0.1:%d" % webdis_port]
        r = subprocess.run(argv, cwd=str(stack.REPO), capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout
    return envoy_from_yaml(workdir, "envoy-generated", config)


def assert_runs(env, upstream, path, key, body=None, headers=None):
    first = post(env, path, key, body=body, headers=headers)
    assert first.status == 200 and first.header("idempotent-replayed") is None, describe(first)
    again = post(env, path, key, body=body, headers=headers)
    assert_replay_of(again, first)
    return first


def test_idem_lint_envoy_runs_a_new_users_policy_the_shipped_ones_and_a_redis_bundle(workdir, upstream, redis_stack,
                                                                                     tmp_path):
    # A newcomer's own route: POST /refunds keyed on a body field.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "create-refund.toml").write_text(
        '[[route]]\nname = "create-refund"\nmatch = { method = "POST", path = "/refunds" }\n'
        '[route.key]\nfrom = "body"\nname = "/refund_no"\nscope = []\n')
    with generated_envoy(workdir, [mine], upstream.port) as env:
        refund = "rf-" + new_key()
        assert_runs(env, upstream, "/refunds", None, body={"refund_no": refund, "amount": 5})
        prom = env.admin("/stats/prometheus").body.decode()
        assert 'idem_requests_total{route="create-refund",outcome="replayed"} 1' in prom, prom[-2000:]
        # A path no policy matches on a route the filter is on is logged, not silent.
        post(env, "/refunds/extra", new_key())
        wait_for(lambda: "no policy matches POST /refunds/extra" in env.log_text(), 5, what="the unmatched warning")
    # The shipped policies; natively, refused at each detached route with the reason (the module
    # would refuse them at load).
    if stack.ARTIFACT == "native":
        r = subprocess.run([str(IDEM_LINT), "envoy", *stack.shipped_policies(), "--upstream", "127.0.0.1:1", *BUILD,
                            "--listeners", str(tmp_path / "refused.json")], cwd=str(stack.REPO), capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and 'route "pay-callback": forward = "detached"' in r.stderr, r.stderr
        assert not (tmp_path / "refused.json").exists(), "nothing is written"
    else:
        with generated_envoy(workdir, stack.shipped_policies(), upstream.port) as env:
            key = new_key()
            assert_runs(env, upstream, "/api/order/create", key)
            assert upstream.calls(key) == 1
    # A Redis bundle: two route files and [redis] in a file of its own.
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    (fleet / "redis.toml").write_text(stack.redis_table(prefix="idem-gen-%s:" % new_key()[-6:]))
    (fleet / "create-payout.toml").write_text(
        '[[route]]\nname = "create-payout"\nmatch = { method = "POST", path = "/payouts" }\nstore = "redis"\n')
    with generated_envoy(workdir, [fleet], upstream.port, redis_stack.webdis.port) as env:
        key = new_key()
        assert_runs(env, upstream, "/payouts", key)
        assert upstream.calls(key) == 1
        assert env.counter("idem.create-payout.stored") >= 1


@pytest.mark.parametrize("store", ["shared", "redis"])
def test_a_policy_edit_applied_with_update_keeps_every_key(workdir, upstream, request, store, tmp_path):
    """`idem-lint envoy … --update` rewrites the listeners file the bootstrap watches: Envoy applies
    the edit (a new route, a longer ttl) without a restart, so a key claimed before it is replayed
    after it — a restart would have forgotten the embedded store's keys (issue 54)."""
    policies = tmp_path / "policies"
    policies.mkdir()
    head = stack.redis_table(prefix="idem-update-%s:" % uuid.uuid4().hex[:6]) if store == "redis" else ""
    route = '[[route]]\nname = "%s"\nmatch = { method = "POST", path = "%s" }\n' + (
        'store = "redis"\n' if store == "redis" else "") + '[route.key]\nttl = "%s"\n'
    (policies / "create-refund.toml").write_text(head + route % ("create-refund", "/refunds", "24h"))
    listeners = tmp_path / "listeners.json"
    argv = [str(IDEM_LINT), "envoy", str(policies), "--upstream", "127.0.0.1:%d" % upstream.port,
            *BUILD, "--listeners", str(listeners)]
    if store == "redis":
        argv += ["--webdis", "127.0.0.1:%d" % request.getfixturevalue("redis_stack").webdis.port]

    def config(lp, ap):
        r = subprocess.run(argv + ["--listen", str(lp), "--admin", str(ap)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout
    with envoy_from_yaml(workdir, "envoy-update", config) as env:
        key = new_key("before-edit")
        first = post(env, "/refunds", key)
        assert first.status == 200 and first.header("idempotent-replayed") is None, describe(first)
        # The edit: a longer ttl, and a second route.
        (policies / "create-refund.toml").write_text(head + route % ("create-refund", "/refunds", "48h"))
        (policies / "cancel-refund.toml").write_text(route % ("cancel-refund", "/refunds/cancel", "24h"))
        before = env.stats("listener_manager.").get("listener_manager.lds.update_success", 0)
        r = subprocess.run(argv + ["--listen", str(env.listen_port), "--admin", str(env.admin_port), "--update"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout == "" and "updated" in r.stderr, r.stderr
        wait_for(lambda: env.stats("listener_manager.").get("listener_manager.lds.update_success", 0) > before, 10,
                 what="Envoy to load the new listeners")
        # The new listener takes new connections once it is warm; each request here opens one.
        wait_for(lambda: post(env, "/refunds/cancel", new_key("probe")).header("idempotent-replayed") is None
                 and "idem.cancel-refund.forwarded" in env.stats("idem.cancel-refund."), 10,
                 what="the edited policies to serve")
        assert_replay_of(post(env, "/refunds", key), first)
        assert upstream.calls(key) == 1, "the key claimed before the edit was kept"
