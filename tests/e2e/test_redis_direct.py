"""`[redis] direct` (issue 58, first part): the native build speaking RESP to Redis itself, no
Webdis running, in a real Envoy 1.40 against a real redis-server — whatever IDEM_ARTIFACT says
(like test_native.py, these Envoys load the .so by its path). Redis' `default` user is the
stack's, limited to the commands idem uses (stack.REDIS_DEFAULT_USER_ACL), its password given
to Envoy in an environment variable (`password_env`), never in the policy."""

import os
import subprocess
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

import stack
from conftest import new_key
from idemtest import assert_local, describe, freeze, post, thaw, wait_for
from test_native import CREATE, native, replayed_across, sixteen_at_once  # noqa: F401 (the fixture)

PASSWORD_ENV = "IDEM_E2E_REDIS_PASSWORD"


def direct_policy(redis_port, prefix, cluster=False, timeout="500ms", password='password_env = "%s"' % PASSWORD_ENV,
                  host="127.0.0.1", extra=()):
    """A one-route bundle on `[redis] direct` (and `cluster`, the Webdis form, for a mixed fleet);
    `password` is the policy line saying where the password is; `extra`, more `[redis]` lines."""
    lines = ["[redis]", 'direct = "%s:%d"' % (host, redis_port), password,
             'timeout = "%s"' % timeout, 'prefix = "%s"' % prefix] + list(extra)
    if cluster:
        lines += ['cluster = "webdis"', 'authority = "webdis"', 'basic_auth = "%s"' % stack.WEBDIS_AUTH]
    return "\n".join(lines) + """

[[route]]
name = "create-order"
match = { method = "POST", path = "/api/order/create" }
store = "redis"
"""


@pytest.fixture
def redis_password(monkeypatch):
    """Envoy inherits the test's environment: the password reaches it there."""
    monkeypatch.setenv(PASSWORD_ENV, stack.REDIS_PASSWORD)


@pytest.fixture
def own_redis(workdir, redis_components):
    r = stack.Redis(workdir)
    yield r
    r.stop()


def prefix():
    return "idem-direct-%s:" % uuid.uuid4().hex[:6]


def keys(redis, pfx):
    return redis.command("KEYS", pfx + "*") or []


def test_a_native_envoy_speaks_resp_to_redis_with_no_webdis(native, make_envoy, upstream, own_redis, redis_password):
    pfx = prefix()
    policy = direct_policy(own_redis.port, pfx)
    env = make_envoy(policy, routes=stack.routes_from_policy(policy), concurrency=4, wasm_path=stack.NATIVE)
    key = new_key("direct")
    first = post(env, CREATE, key, body=b'{"sku":"A1"}')
    assert first.status == 200 and first.header("idempotent-replayed") is None, first
    again = post(env, CREATE, key, body=b'{"sku":"A1"}')
    assert again.status == 200 and again.header("idempotent-replayed") == "true", again
    assert again.body == first.body
    assert_local(post(env, CREATE, key, body=b'{"sku":"B2"}'), 422, "IDEMPOTENCY_KEY_REUSED")
    assert upstream.calls(key) == 1
    # The record is in Redis, where the Webdis path writes it.
    assert [k for k in keys(own_redis, pfx) if b":k:" in k], keys(own_redis, pfx)
    for _ in range(3):
        sixteen_at_once(upstream, [env], new_key("direct-race"))


def test_a_fleet_of_wasm_through_webdis_and_native_direct_shares_its_keys(native, make_envoy, upstream, redis_stack,
                                                                          redis_password):
    """A migration: one bundle with both forms; the .wasm reads `cluster` (Webdis), the native
    build `direct`. The same records, so a key run on either is replayed on the other."""
    pfx = prefix()
    policy = direct_policy(redis_stack.redis.port, pfx, cluster=True)
    routes = stack.routes_from_policy(policy)
    webdis = [stack.webdis_cluster(redis_stack.webdis.port)]
    wasm = make_envoy(policy, routes=routes, extra_clusters=webdis, wasm_path=stack.WASM)
    direct = make_envoy(policy, routes=routes, extra_clusters=webdis, wasm_path=stack.NATIVE)
    replayed_across(upstream, wasm, direct)
    sixteen_at_once(upstream, [wasm, direct], new_key("mixed-direct-race"))
    # The native Envoy sent nothing through Webdis.
    assert direct.stats("cluster.webdis.upstream_rq_total").get("cluster.webdis.upstream_rq_total", 0) == 0


def test_redis_stopped_then_restarted_is_a_store_error_then_works_again(native, make_envoy, upstream, own_redis,
                                                                       redis_password):
    """Redis paused: the claim gets no answer within `timeout` and the request the route's
    `on_store_error` (503, not forwarded). Redis restarted on its port (every key gone): the
    module connects again and protects the next request."""
    pfx = prefix()
    policy = direct_policy(own_redis.port, pfx, timeout="300ms")
    env = make_envoy(policy, routes=stack.routes_from_policy(policy), concurrency=4, wasm_path=stack.NATIVE)
    assert post(env, CREATE, new_key("before")).status == 200
    freeze(own_redis.proc.pid)
    try:
        # Twenty at once on four workers, on the connection made before the pause: every one is
        # answered (pipelined claims, a claim batch, reconnections that time out), none forwarded.
        with ThreadPoolExecutor(max_workers=20) as pool:
            answers = list(pool.map(lambda i: post(env, CREATE, new_key("paused-%d" % i), timeout=20), range(20)))
        assert {a.status for a in answers} == {503}, [a.status for a in answers]
        paused = new_key("paused")
        assert_local(post(env, CREATE, paused), 503, "IDEMPOTENCY_STORE_UNAVAILABLE")
        assert upstream.calls(paused) == 0
    finally:
        thaw(own_redis.proc.pid)
    own_redis.restart()
    after = new_key("after")
    answers = []
    wait_for(lambda: answers.append(post(env, CREATE, after)) or answers[-1].status == 200, 10,
             what="a request protected again after Redis restarted")
    again = post(env, CREATE, after)
    assert again.header("idempotent-replayed") == "true", again
    assert upstream.calls(after) == 1


def test_the_wasm_refuses_a_bundle_that_names_only_direct(make_envoy, workdir, upstream, own_redis):
    policy = direct_policy(own_redis.port, prefix())
    env = stack.start_idem_envoy(workdir, upstream.port, policy, wait=False, wasm_path=stack.WASM)
    try:
        stack.wait_until(lambda: "[redis] names only `direct`" in env.log_text(), 30)
        assert "[redis] names only `direct`" in env.log_text(), env.log_tail(20)
        assert "add `cluster`" in env.log_text()
    finally:
        env.stop()


def test_a_password_variable_envoy_does_not_have_is_refused_at_load(native, workdir, upstream, own_redis,
                                                                    monkeypatch):
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    refused_at_load(workdir, upstream, direct_policy(own_redis.port, prefix()), 'password_env = "%s"' % PASSWORD_ENV)


def refused_at_load(workdir, upstream, policy, line):
    """A native Envoy on `policy` exits while loading, its log saying `line`."""
    env = stack.start_idem_envoy(workdir, upstream.port, policy, wait=False, wasm_path=stack.NATIVE)
    try:
        stack.wait_until(lambda: not env.proc.alive(), 30)
        assert not env.proc.alive(), "Envoy runs on a policy it should refuse (%s)" % line
        assert line in env.log_text(), env.log_tail(20)
    finally:
        env.stop()


def test_a_password_file_authenticates_and_an_unreadable_one_is_refused_at_load(native, make_envoy, workdir,
                                                                                  upstream, own_redis, monkeypatch):
    """`password_file`: a mounted secret, read at each connection, its trailing newline dropped
    (as `echo` and Kubernetes secrets write it). A file Envoy cannot read fails the load."""
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    secret = os.path.join(workdir, "redis-password")
    with open(secret, "w") as f:
        f.write(stack.REDIS_PASSWORD + "\n")
    pfx = prefix()
    policy = direct_policy(own_redis.port, pfx, password='password_file = "%s"' % secret)
    env = make_envoy(policy, routes=stack.routes_from_policy(policy), wasm_path=stack.NATIVE)
    key = new_key("password-file")
    assert post(env, CREATE, key).status == 200
    assert post(env, CREATE, key).header("idempotent-replayed") == "true"
    assert upstream.calls(key) == 1
    assert [k for k in keys(own_redis, pfx) if b":k:" in k], "no record in Redis"

    missing = os.path.join(workdir, "no-such-secret")
    refused_at_load(workdir, upstream, direct_policy(own_redis.port, prefix(), password='password_file = "%s"' % missing),
                    'password_file = "%s": cannot read it' % missing)


def tls_files(workdir, name):
    """A certificate authority and a server certificate it signs for the name `localhost` only
    (openssl, P-256 keys): the directory holding ca.pem, server.pem and server.key."""
    d = os.path.join(workdir, "tls-%s-%s" % (name, uuid.uuid4().hex[:6]))
    os.makedirs(d)

    def openssl(*args):
        done = subprocess.run(["openssl"] + list(args), cwd=d, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, "openssl %s: %s" % (" ".join(args), done.stderr)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=idem test CA %s" % name)
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write("subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf")
    return d


def test_tls_to_redis_checks_the_servers_certificate(native, make_envoy, workdir, upstream, redis_components,
                                                     redis_password):
    """`tls = true`: the module speaks TLS to Redis' `tls-port`, the certificate checked against
    `tls_ca_file` and its name against `direct`'s host. Reached by a name the certificate does not
    carry (127.0.0.1), signed by another authority, or spoken to in plain TCP, the TLS port answers
    nothing the module trusts: a store error (503), never a forward, and the log says why. A CA file
    that holds no certificate is refused at load."""
    ours, theirs = tls_files(workdir, "ours"), tls_files(workdir, "theirs")
    tls_port = stack.free_port()
    redis = stack.Redis(workdir, extra_args=[
        "--tls-port", str(tls_port), "--tls-cert-file", os.path.join(ours, "server.pem"),
        "--tls-key-file", os.path.join(ours, "server.key"), "--tls-ca-cert-file", os.path.join(ours, "ca.pem"),
        "--tls-auth-clients", "no"])
    try:
        pfx = prefix()
        with_ca = ["tls = true", 'tls_ca_file = "%s"' % os.path.join(ours, "ca.pem")]
        policy = direct_policy(tls_port, pfx, host="localhost", extra=with_ca)
        env = make_envoy(policy, routes=stack.routes_from_policy(policy), wasm_path=stack.NATIVE)
        key = new_key("tls")
        first = post(env, CREATE, key)
        assert first.status == 200 and first.header("idempotent-replayed") is None, describe(first)
        assert post(env, CREATE, key).header("idempotent-replayed") == "true"
        assert upstream.calls(key) == 1
        assert [k for k in keys(redis, pfx) if b":k:" in k], "no record in Redis"

        other_name = direct_policy(tls_port, prefix(), host="127.0.0.1", extra=with_ca)
        wrong_ca = direct_policy(tls_port, prefix(), host="localhost",
                                 extra=["tls = true", 'tls_ca_file = "%s"' % os.path.join(theirs, "ca.pem")])
        plain = direct_policy(tls_port, prefix(), timeout="300ms")
        for policy, why in ((other_name, "certificate not valid for name \"127.0.0.1\""),
                            (wrong_ca, "invalid peer certificate"), (plain, "([redis] direct)")):
            env = make_envoy(policy, routes=stack.routes_from_policy(policy), wasm_path=stack.NATIVE)
            key = new_key("tls-refused")
            assert_local(post(env, CREATE, key), 503, "IDEMPOTENCY_STORE_UNAVAILABLE")
            assert upstream.calls(key) == 0
            wait_for(lambda: why in env.log_text(), 5, what="the failure logged (%s)" % why)
    finally:
        redis.stop()
    empty = os.path.join(workdir, "empty-ca.pem")
    open(empty, "w").close()
    refused_at_load(workdir, upstream, direct_policy(6379, prefix(), extra=["tls = true", 'tls_ca_file = "%s"' % empty]),
                    'tls_ca_file = "%s": it holds no PEM certificate' % empty)


def test_connections_killed_mid_traffic_run_no_request_twice(native, make_envoy, upstream, own_redis,
                                                             redis_password):
    """Redis drops the module's connection (`CLIENT KILL`) five times while 120 requests with
    their own keys run: replies lost mid-pipeline read as a store error (the claim released,
    owner-checked, or the completion retried), never as a claim or an answer. Each key runs at
    most once meanwhile, and a client retrying each one until it is answered gets it run once."""
    pfx = prefix()
    policy = direct_policy(own_redis.port, pfx)
    env = make_envoy(policy, routes=stack.routes_from_policy(policy), concurrency=2, wasm_path=stack.NATIVE)
    keys_sent = [new_key("killed-%d" % i) for i in range(120)]
    stop = threading.Event()

    def killer():
        for _ in range(5):
            if stop.wait(0.04):
                return
            own_redis.command("CLIENT", "KILL", "TYPE", "normal")
    kills = threading.Thread(target=killer)
    kills.start()
    with ThreadPoolExecutor(max_workers=20) as pool:
        first = list(pool.map(lambda k: post(env, CREATE, k, headers={"x-demo-delay-ms": "30"}, timeout=20),
                              keys_sent))
    stop.set()
    kills.join(10)
    # The module saw its connection go (logged once per failing streak).
    wait_for(lambda: "([redis] direct)" in env.log_text(), 5, what="the lost connection logged")
    assert {a.status for a in first} <= {200, 409, 503}, sorted(a.status for a in first)
    assert all(upstream.calls(k) <= 1 for k in keys_sent), [upstream.calls(k) for k in keys_sent]
    for key in keys_sent:
        seen = []
        wait_for(lambda: seen.append(post(env, CREATE, key, timeout=10)) or seen[-1].status == 200, 15,
                 what="key %s answered 200 (seen %s)" % (key, [a.status for a in seen]))
        assert upstream.calls(key) == 1, (key, [a.status for a in seen])
