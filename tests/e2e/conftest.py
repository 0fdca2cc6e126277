"""End-to-end fixtures: a real demo upstream and real Envoy 1.40 running the built idem filter.

Every Envoy is started on free loopback ports from a generated config (scripts/stack/) and
the policy TOML given by the test, waited for until it serves, and stopped after the test
(also when it fails; its log tail is then printed). A missing Envoy or filter is a failure
with a message saying how to get it, never a skip.
"""

import contextlib
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import stack  # noqa: E402

TEST_POLICY = """
[shared]
buckets = 256
entries_per_bucket = 8
max_response_bytes = 16384

[[route]]
name = "create-order"
match = { method = "POST", path = "/api/order/create" }
mode = "key"

[route.key]
from = "header"
name = "Idempotency-Key"
scope = ["header:authorization"]
lock_ttl = "30s"
ttl = "24h"

[[route]]
name = "pay-callback"
match = { method = "POST", path = "/api/pay/callback" }

[route.key]
from = "body"
name = "/transaction_id"
scope = []
fingerprint = []

[route.duplicate]
code = "DUPLICATE_CALLBACK"

[[route]]
name = "order-pay"
match = { method = "POST", path = "/api/orders/{id}/pay" }

[[route]]
name = "reject-dup"
match = { method = "POST", path = "/t/reject" }

[route.key]
on_completed = "reject"

[route.duplicate]
status = 409
code = "ORDER_ALREADY_SUBMITTED"
message = "请勿重复提交"

[[route]]
name = "small-body"
match = { method = "POST", path = "/t/small-body" }
max_body_bytes = 1024

[[route]]
name = "tombstone"
match = { method = "POST", path = "/t/tombstone" }
max_response_bytes = 1024

[[route]]
name = "shadow"
match = { method = "POST", path = "/t/shadow" }
mode = "shadow"

[[route]]
name = "query-key"
match = { method = "POST", path = "/t/query" }

[route.key]
from = "query"
name = "key"

[[route]]
name = "optional-key"
match = { method = "POST", path = "/t/optional" }

[route.key]
required = false

# No `match`: the policy applies to the Envoy route whose name is "by-route-name".
[[route]]
name = "by-route-name"

[[route]]
name = "canonical"
match = { method = "POST", path = "/t/canonical" }

[route.key]
fingerprint = ["method", "path", "body"]
fingerprint_body = "canonical-json"

[[route]]
name = "timeouts"
match = { method = "POST", path = "/t/timeouts" }

[route.key]
lock_ttl = "30s"

[[route]]
name = "short-lease"
match = { method = "POST", path = "/t/short-lease" }

[route.key]
lock_ttl = "2s"
unknown_outcome_hold = "4s"

[[route]]
name = "dup-200"
match = { method = "POST", path = "/t/dup-200" }

[route.key]
on_completed = "reject"

[route.duplicate]
status = 200
code = "ALREADY_PROCESSED"
message = "this callback was already processed"

[[route]]
name = "remember-2xx"
match = { method = "POST", path = "/t/remember-2xx" }

[route.key]
remember = ["2xx"]

[[route]]
name = "short-ttl"
match = { method = "POST", path = "/t/short-ttl" }

[route.key]
ttl = "2s"
"""

# The shared test Envoy's routes, from TEST_POLICY (one per policy route: /api/orders/ is the
# prefix of order-pay's template), plus what the policy cannot say: the Envoy route that
# by-route-name matches by name, Envoy giving up on the upstream after 1 s on /t/timeouts (504:
# the outcome is unknown, the claim must be held), and a catch-all with no filter.
TEST_ROUTES = stack.routes_from_policy(
    TEST_POLICY,
    envoy={"by-route-name": {"match": {"path": "/t/by-name"}}, "timeouts": {"timeout": "1s"}},
    after=[{"name": "passthrough", "match": {"prefix": "/"}, "idem": False}],
)


def new_key(prefix="k"):
    return "%s-%s" % (prefix, uuid.uuid4().hex)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


# What the native build refuses at load (native/src/refusal.rs; test_native.py holds each refusal
# and its reason): a test of it (marked wasm_only) runs on the .wasm only. Under
# IDEM_ARTIFACT=native such tests are deselected, not skipped.


def pytest_configure(config):
    config.addinivalue_line("markers", "wasm_only(reason): a behaviour the native build refuses at load")


def _wasm_only(item):
    marker = item.get_closest_marker("wasm_only")
    if marker is not None:
        return marker.args[0] if marker.args else "marked wasm_only"
    return None


def pytest_collection_modifyitems(config, items):
    if stack.ARTIFACT != "native":
        return
    keep, dropped = [], {}
    for item in items:
        why = _wasm_only(item)
        if why is None:
            keep.append(item)
        else:
            dropped.setdefault(why, []).append(item)
    if dropped:
        config.hook.pytest_deselected(items=[i for group in dropped.values() for i in group])
        items[:] = keep
        config._idem_native_dropped = {why: len(group) for why, group in dropped.items()}


def pytest_terminal_summary(terminalreporter, config):
    for why, n in sorted(getattr(config, "_idem_native_dropped", {}).items()):
        terminalreporter.write_line("native build: %d test(s) deselected, the build refuses %s at load" % (n, why))


def _failed(node):
    return any(getattr(getattr(node, "rep_" + w, None), "failed", False) for w in ("setup", "call"))


@pytest.fixture(scope="session")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("idem-e2e")


@pytest.fixture(scope="session", autouse=True)
def components():
    """Fail (not skip) every test when Envoy or the built filter is missing."""
    try:
        stack.require_envoy()
        stack.require_wasm()
    except stack.StackError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def upstream(workdir):
    up = stack.Upstream(workdir)
    yield up
    up.stop()


@pytest.fixture(scope="module")
def idem(workdir, upstream):
    """One Envoy with TEST_POLICY, shared by the tests of a module (each test uses its own keys)."""
    env = _start(workdir, upstream.port, TEST_POLICY, TEST_ROUTES)
    yield env
    env.stop()


@pytest.fixture(autouse=True)
def _log_tail_on_failure(request):
    yield
    if _failed(request.node) and "idem" in request.fixturenames:
        env = request.getfixturevalue("idem")
        print("\n--- Envoy log tail (%s) ---\n%s" % (env.config_path, env.log_tail(60)))


@pytest.fixture
def make_envoy(workdir, upstream, request):
    """Start an Envoy with the given policy (and routes); stopped after the test."""
    started = []

    def make(policy, routes=None, upstream_port=None, **kw):
        env = _start(workdir, upstream_port or upstream.port, policy, routes, **kw)
        started.append(env)
        return env

    yield make
    for env in started:
        if _failed(request.node):
            print("\n--- Envoy log tail (%s) ---\n%s" % (env.config_path, env.log_tail(60)))
        env.stop()


@contextlib.contextmanager
def envoy_from_yaml(workdir, name, config_text):
    """Envoy started from a YAML config, `config_text(listen_port, admin_port)` on two free ports:
    yielded once ready (the test fails with Envoy's log tail if it is not), stopped afterwards
    (its log tail printed if it died)."""
    lp, ap = stack.free_port(), stack.free_port()
    cfg = workdir / ("%s-%d.yaml" % (name, lp))
    cfg.write_text(config_text(lp, ap))
    env = stack.Envoy(cfg, workdir, listen_port=lp, admin_port=ap, name=name)
    try:
        try:
            env.wait_ready()
        except stack.StackError as e:
            pytest.fail(str(e), pytrace=False)
        yield env
    finally:
        if not env.proc.alive():
            print(env.log_tail())
        env.stop()


def _start(workdir, upstream_port, policy, routes, **kw):
    try:
        return stack.start_idem_envoy(workdir, upstream_port, policy, routes=routes, **kw)
    except stack.StackError as e:
        pytest.fail(str(e), pytrace=False)


# ---------------------------------------------------------------------------- Redis + Webdis

@pytest.fixture(scope="session")
def redis_components():
    """Fail (not skip) when redis-server or webdis is missing."""
    try:
        stack.require_redis()
    except stack.StackError as e:
        pytest.fail(str(e), pytrace=False)


class RedisStack:
    """A real redis-server and a real webdis (examples/webdis.json, ports rewritten) in front of it."""

    def __init__(self, workdir):
        self.redis = stack.Redis(workdir)
        try:
            self.webdis = stack.Webdis(workdir, self.redis.port)
        except Exception:
            self.redis.stop()
            raise

    def keys(self, pattern):
        return sorted(self.redis.command("KEYS", pattern) or [])

    def stop(self):
        self.webdis.stop()
        self.redis.stop()

    def log_tails(self):
        return "--- webdis log ---\n%s\n--- redis log ---\n%s" % (self.webdis.proc.log_tail(20),
                                                                 self.redis.proc.log_tail(20))


def _start_redis_stack(workdir):
    try:
        return RedisStack(workdir)
    except stack.StackError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="module")
def redis_stack(workdir, redis_components):
    """Redis + Webdis shared by a module's tests (tests use their own keys / key prefixes)."""
    rs = _start_redis_stack(workdir)
    yield rs
    rs.stop()


@pytest.fixture
def own_redis_stack(workdir, redis_components, request):
    """Redis + Webdis for one test that kills or restarts them."""
    rs = _start_redis_stack(workdir)
    yield rs
    if _failed(request.node):
        print("\n" + rs.log_tails())
    rs.stop()


@pytest.fixture
def make_fleet(workdir, upstream, request):
    """Start n Envoys with the same policy, sharing one Webdis; stopped after the test."""
    started = []

    def make(policy, routes, webdis_port, n=2, upstream_port=None, **kw):
        try:
            envs = stack.start_fleet(workdir, upstream_port or upstream.port, webdis_port, policy, routes=routes,
                                     n=n, **kw)
        except stack.StackError as e:
            pytest.fail(str(e), pytrace=False)
        started.extend(envs)
        return envs

    yield make
    for env in started:
        if _failed(request.node):
            print("\n--- Envoy log tail (%s) ---\n%s" % (env.config_path, env.log_tail(60)))
        env.stop()


@pytest.fixture(scope="module")
def module_gateway(workdir, upstream, request, redis_components):
    """`make_gateway` for a module whose tests each use their own keys: one Envoy per store and
    configuration, started at its first use and kept for the module's other tests (a `.wasm`
    Envoy's start compiles the module: about 2 s of CPU), stopped at the module's end. A failed
    test prints the log tails (`_module_gateway_logs_on_failure`)."""
    kept = {}

    def make(store, policy_toml, routes, **kw):
        key = (store, policy_toml, repr(routes), repr(sorted(kw.items())))
        if key not in kept:
            upstream_port = kw.pop("upstream_port", None) or upstream.port
            if store == "shared":
                kept[key] = _start(workdir, upstream_port, policy_toml, routes, **kw)
            else:
                rs = request.getfixturevalue("redis_stack")
                try:
                    kept[key] = stack.start_fleet(workdir, upstream_port, rs.webdis.port, policy_toml, routes=routes,
                                                  n=1, **kw)[0]
                except stack.StackError as e:
                    pytest.fail(str(e), pytrace=False)
        return kept[key]
    make.kept = kept
    yield make
    for env in kept.values():
        env.stop()


@pytest.fixture(autouse=True)
def _module_gateway_logs_on_failure(request):
    yield
    if _failed(request.node) and "module_gateway" in request.fixturenames:
        for env in request.getfixturevalue("module_gateway").kept.values():
            print("\n--- Envoy log tail (%s) ---\n%s" % (env.config_path, env.log_tail(60)))


@pytest.fixture
def make_gateway(request, make_envoy, make_fleet, redis_components):
    """One Envoy on `store`: the shared-data store, or Redis (a one-Envoy fleet on the module's
    Redis + Webdis). For tests parametrised over both stores."""
    def make(store, policy_toml, routes, **kw):
        if store == "shared":
            return make_envoy(policy_toml, routes, **kw)
        rs = request.getfixturevalue("redis_stack")
        return make_fleet(policy_toml, routes, rs.webdis.port, n=1, **kw)[0]
    return make
