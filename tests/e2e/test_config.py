"""Loading: bad policies refuse to load, JSON bundles work, the example config runs, and the
filter reports itself through /stats counters and one log line per interception."""

import json
import re
import socket

import pytest

import stack
from conftest import envoy_from_yaml, new_key
from idemtest import assert_local, assert_replay_of, assert_upstream_answer, counters, describe, post, wait_for

CREATE = "/api/order/create"

GOOD_ROUTE = """
[[route]]
name = "create-order"
match = { method = "POST", path = "/api/order/create" }
"""

# case -> (policy, tokens the `idem: invalid policy` line must contain)
BAD_POLICIES = {
    "unknown-field": (GOOD_ROUTE + 'colour = "blue"\n', ["colour"]),
    "bad-duration": (GOOD_ROUTE + '\n[route.key]\nlock_ttl = "30 parsecs"\n', [("lock_ttl", "30 parsecs")]),
    "5xx-duplicate-status": (GOOD_ROUTE + "\n[route.duplicate]\nstatus = 503\n", ["status"]),
    "duplicate-route-name": (GOOD_ROUTE + GOOD_ROUTE.replace("/api/order/create", "/other"), ["create-order"]),
    "unknown-mode": (GOOD_ROUTE + 'mode = "maybe"\n', [("mode", "maybe")]),
    "not-toml": ("[[route]\nname = ", []),
    "response-slot-too-small": ("[shared]\nmax_response_bytes = 1024\n" + GOOD_ROUTE + "max_response_bytes = 4096\n",
                                ["max_response_bytes"]),
}


@pytest.mark.parametrize("case", sorted(BAD_POLICIES))
def test_bad_policy_refuses_to_load(case, workdir, upstream):
    policy, reasons = BAD_POLICIES[case]
    env = stack.start_idem_envoy(workdir, upstream.port, policy, wait=False)
    try:
        # Envoy must exit non-zero, or at least never serve the listener.
        # (wait until it exits, or until its admin says it is up and the listener's fate is decided)
        def decided():
            if not env.proc.alive():
                return True
            try:
                return env.admin("/ready", timeout=1).status == 200
            except OSError:
                return False
        wait_for(decided, 30, interval=0.1, what="Envoy to exit or become ready")
        # Ready is not the end of it: give a started Envoy a grace of 0.5 s to exit all the same
        # (at once if it already has); one still running after that must not serve.
        stack.wait_until(lambda: not env.proc.alive(), 0.5)
        if env.proc.alive():
            try:
                r = env.request("POST", CREATE, headers={"Idempotency-Key": "k"}, body={}, timeout=3)
                pytest.fail("Envoy serves with a bad policy (%s): %s" % (case, describe(r)))
            except OSError:
                pass
        else:
            assert env.proc.p.returncode != 0, "Envoy exited 0 with a bad policy"
        log = env.log_text()
        lines = [l for l in log.splitlines() if "idem: invalid policy" in l]
        assert lines, "no `idem: invalid policy` line in Envoy's log:\n%s" % env.log_tail(30)
        for reason in reasons:  # a token, or a tuple of acceptable alternatives
            alternatives = reason if isinstance(reason, tuple) else (reason,)
            assert any(a in l for a in alternatives for l in lines), \
                "the invalid-policy line does not name %s:\n%s" % (" or ".join(map(repr, alternatives)),
                                                                   "\n".join(lines))
    finally:
        env.stop()


def test_json_policy_bundle_is_accepted(make_envoy, upstream):
    bundle = {"shared": {"buckets": 16, "entries_per_bucket": 4},
              "route": [{"name": "create-order", "match": {"method": "POST", "path": CREATE},
                         "key": {"from": "header", "name": "Idempotency-Key"},
                         "duplicate": {"status": 409, "code": "DUPLICATE_REQUEST"}}]}
    env = make_envoy(json.dumps(bundle))
    assert_local(post(env, CREATE, None), 400, "IDEMPOTENCY_KEY_MISSING")
    key = new_key()
    first = post(env, CREATE, key)
    assert_replay_of(post(env, CREATE, key), first)


def test_counters_in_stats_and_log_lines(make_envoy, upstream):
    import threading
    env = make_envoy(GOOD_ROUTE)
    k1, k2 = "K1abcdefgh-" + new_key(), "K2abcdefgh-" + new_key()
    assert_upstream_answer(post(env, CREATE, k1))                       # forwarded
    first = post(env, CREATE, k1)                                        # replayed
    assert first.header("idempotent-replayed") == "true", describe(first)
    assert_local(post(env, CREATE, k1, body={"x": 1}), 422, "IDEMPOTENCY_KEY_REUSED")   # key_reused
    assert_local(post(env, CREATE, None), 400, "IDEMPOTENCY_KEY_MISSING")               # missing_key
    assert_local(post(env, CREATE, "x" * 300), 400, "IDEMPOTENCY_KEY_INVALID")          # invalid_key
    t = threading.Thread(target=post, args=(env, CREATE, k2), kwargs={"headers": {"x-demo-delay-ms": "1500"},
                                                                          "timeout": 20})
    t.start()
    try:
        wait_for(lambda: upstream.calls(k2) == 1, 10, what="the slow request to reach the upstream")
        assert_local(post(env, CREATE, k2), 409, "REQUEST_IN_PROGRESS", retry_after=True)  # in_flight
    finally:
        t.join(30)
    got = counters(env, "create-order")
    want = {"forwarded": 2, "replayed": 1, "key_reused": 1, "missing_key": 1, "invalid_key": 1, "in_flight": 1}
    wrong = {k: (v, got.get(k)) for k, v in want.items() if got.get(k) != v}
    assert not wrong, "counter (want, got): %s; all idem.create-order.* = %s" % (wrong, got)
    # as Envoy lists them: /stats shows the full name made for tag extraction, Prometheus one
    # labelled family (the bootstrap carries the stats_tags, as examples/envoy.yaml does)
    # (the native build's: one labelled family Envoy prefixes, docs/deploy.md "The native build")
    native = stack.ARTIFACT == "native"
    raw = env.admin("/stats?filter=idem").body.decode()
    name = (r"dynamicmodulescustom\.idem_requests_total\.route\.create-order\.outcome\.forwarded" if native
            else r"(wasmcustom\.)?route=\.=create-order;\.;outcome=\.=forwarded;\.;idem_requests_total")
    assert re.search(r"^%s: 2$" % name, raw, re.M), raw
    prom = env.admin("/stats/prometheus").body.decode()
    family = "envoy_dynamicmodulescustom_idem_requests_total" if native else "idem_requests_total"
    assert re.search(r'^%s\{route="create-order",outcome="forwarded"\} 2$' % family, prom, re.M), \
        "\n".join(l for l in prom.splitlines() if "idem" in l)[:2000]

    # one log line per interception: route, truncated key, cause; never the whole key
    def logged():
        return [l for l in env.log_text().splitlines() if "route=create-order" in l and "key=" + k1[:8] in l]
    wait_for(lambda: len(logged()) >= 2, 5, what="interception log lines for %s" % k1[:8])
    for line in logged():
        assert re.search(r"idem: \S+.* route=create-order key=%s\S* cause=\S+" % re.escape(k1[:8]), line), line
    log = env.log_text()
    for k in (k1, k2):
        assert k not in log, "a whole idempotency key appears in the log"


def test_example_envoy_yaml_runs(workdir, upstream):
    """examples/envoy.yaml as shipped (only ports and the .wasm path rewritten)."""
    example = lambda lp, ap: stack.example_config_text(lp, ap, upstream.port, stack.WASM)  # noqa: E731
    with envoy_from_yaml(workdir, "envoy-example", example) as env:
        key = new_key()
        first = post(env, CREATE, key)
        assert_upstream_answer(first, key=key, n=1)
        assert_replay_of(post(env, CREATE, key), first)
        # Aliases that frameworks route to the same handler are the same protected endpoint.
        for alias in ("/api/order/Create/", "/api//order/create", "/api/x/../order/create", "/api/order/%63reate"):
            assert_replay_of(post(env, alias, key), first)
        assert upstream.calls(key) == 1
        assert_local(post(env, CREATE, key, body={"qty": 9}), 422, "IDEMPOTENCY_KEY_REUSED")
        assert_local(post(env, CREATE, None), 400, "IDEMPOTENCY_KEY_MISSING")
        txn = new_key("tx")
        cb = post(env, "/api/pay/callback", body={"transaction_id": txn, "status": "PAID"})
        assert cb.status == 200 and cb.json()["code"] == "SUCCESS", describe(cb)
        assert_replay_of(post(env, "/api/pay/callback", body={"status": "PAID", "transaction_id": txn}), cb)
        assert_local(post(env, "/api/orders/7/pay", None), 400, "IDEMPOTENCY_KEY_MISSING")
        assert_upstream_answer(post(env, "/healthz", None))
        assert counters(env, "create-order").get("replayed") == 5
        # As shipped, the example exports one labelled family to Prometheus ...
        prom = env.admin("/stats/prometheus").body.decode()
        assert "# TYPE idem_requests_total counter" in prom, prom[:2000]
        assert 'idem_requests_total{route="create-order",outcome="replayed"} 5' in prom, \
            [l for l in prom.splitlines() if "idem_requests_total" in l][:40]
        assert 'idem_unmatched_total{outcome="passed"}' in prom
        # Zero series only for what the shipped alerts read (`[metrics] zero_series = "alerted"`):
        # store_error is there at 0 before any store error; missing_key appeared with its count;
        # an outcome a key route never had (token_issued) is not exported at all.
        assert 'idem_requests_total{route="create-order",outcome="store_error"} 0' in prom
        assert 'idem_requests_total{route="create-order",outcome="missing_key"} 1' in prom
        assert 'idem_requests_total{route="create-order",outcome="token_issued"}' not in prom
        series = [l for l in prom.splitlines() if l.startswith("idem_requests_total{")]
        assert len(series) < 12 * 5, "%d series for 5 routes" % len(series)
        # ... and logs each request's decision in Envoy's own access log (stdout is flushed when
        # Envoy stops).
        env.stop()
        line = next((l for l in env.log_text().splitlines() if "idem_outcome=replayed" in l), None)
        assert line is not None, env.log_tail(40)
        assert "idem_route=create-order" in line and "idem_cause=completed" in line and " 200 " in line, line
        assert key not in line, "the access log must not carry the whole key: %s" % line
