"""Real SDK retries through real Envoy: never a second execution, and the first answer when the
gateway can get it.

The clients are a real Stainless-generated SDK (orb-billing, from PyPI and from npm; see
tests/e2e/sdk/README.md): one auto-generated `Idempotency-Key` kept across retries, a retry on
timeouts and 409, `Retry-After` honoured, `x-should-retry: false` obeyed. The scenario is the
one that ran the business twice before: the first call is slower than the SDK's timeout, the SDK
disconnects (Envoy resets the upstream request) and retries with the same key.

- default forwarding: the outcome is unknown, the claim is held past its lease, the retry gets
  409 IDEMPOTENCY_OUTCOME_UNKNOWN with `x-should-retry: false`: one execution, a clear error.
- `forward = "detached"`: the root context sent the request, so the client leaving cancels
  nothing; the retry gets 409 REQUEST_IN_PROGRESS with `Retry-After: 1`, then the replay of the
  first answer: one execution, and the SDK returns the first execution's result.

Both stores; a scripted client with the same timing besides the SDKs.
"""

import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

import stack
from conftest import new_key
from idemtest import describe, wait_for

# The native build refuses this module's policy at load.
pytestmark = pytest.mark.wasm_only("forward = \"detached\" (the module's policy has sdk-detached)")

SDK_DIR = Path(__file__).resolve().parent / "sdk"
PREFIX = "idem-sdk-%s:" % uuid.uuid4().hex[:6]

# The upstream takes 2 s; the SDKs give up on an attempt after 1 s.
DELAY_MS = 2000
SDK_TIMEOUT_S = 1
SDK_RETRIES = 4


def policy(store):
    head = stack.redis_table(timeout="1s", prefix=PREFIX) if store == "redis" else ""
    # lock_ttl 2 s: shorter than the whole retry sequence, so a takeover at lease end would show.
    return head + """
[[route]]
name = "sdk-inline"
match = {{ method = "POST", path = "/sdk/inline" }}
store = "{store}"

[route.key]
lock_ttl = "2s"
unknown_outcome_hold = "1h"

[[route]]
name = "sdk-detached"
match = {{ method = "POST", path = "/sdk/detached" }}
store = "{store}"
forward = "detached"
upstream_timeout = "10s"

[route.key]
lock_ttl = "2s"
""".format(store=store)


# Envoy's routes, from the policy's, and a catch-all with no filter.
ROUTES = stack.routes_from_policy(policy("shared"), after=[{"name": "passthrough", "match": {"prefix": "/"}, "idem": False}])


@pytest.fixture(params=["shared", "redis"])
def gateway(request, module_gateway):
    """One gateway per store for the module: every run uses its own keys."""
    return module_gateway(request.param, policy(request.param), ROUTES)


def store_of(env):
    return "redis" if env.name.startswith("envoy-fleet") else "shared"


def run_sdk(lang, env, path, body):
    if lang == "python":
        argv = [str(stack.REPO / ".venv" / "bin" / "python"), str(SDK_DIR / "py_client.py")]
    else:
        node = shutil.which("node")
        assert node, "node not found: install Node.js >= 20 (the Node SDK test needs it)"
        assert (SDK_DIR / "node_modules" / "orb-billing").is_dir(), \
            "orb-billing not installed for Node: run `make setup` (npm ci in tests/e2e/sdk)"
        argv = [node, str(SDK_DIR / "node_client.mjs")]
    argv += ["--base-url", "http://127.0.0.1:%d" % env.listen_port, "--path", path,
             "--timeout", str(SDK_TIMEOUT_S), "--max-retries", str(SDK_RETRIES),
             "--body", json.dumps(body), "--header", "x-demo-delay-ms:%d" % DELAY_MS]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, "SDK client failed: %s %s" % (out.stdout, out.stderr)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    keys = {a["idempotency_key"] for a in result["attempts"]}
    assert len(keys) == 1 and None not in keys, "the SDK must keep one key across retries: %s" % result
    return result


def executions(upstream, key):
    return upstream.calls(key=key)


def settle(upstream, key, want=1, timeout=8.0):
    """Wait until the upstream ran `want` times for the key, then a bit longer to catch a second run."""
    wait_for(lambda: executions(upstream, key) >= want, timeout, what="the upstream to run the request")
    # A duration, not a state: a second execution would show within one more upstream run; its
    # absence can only be waited out.
    time.sleep(DELAY_MS / 1000.0 + 0.5)
    return executions(upstream, key)


@pytest.mark.parametrize("lang", ["python", "node"])
def test_sdk_timeout_retry_never_runs_twice_and_gets_a_clear_error(gateway, upstream, lang):
    result = run_sdk(lang, gateway, "/sdk/inline", {"sku": new_key("sku")})
    key = result["idempotency_key"]
    assert settle(upstream, key) == 1, "the business ran twice: %s" % json.dumps(result)
    assert result["ok"] is False and result["status"] == 409, json.dumps(result)
    assert result["body"]["code"] == "IDEMPOTENCY_OUTCOME_UNKNOWN", json.dumps(result)
    last = result["attempts"][-1]
    assert last["x_should_retry"] == "false" and last["retry_after"] is None, json.dumps(result)
    # The SDK stopped there instead of sleeping until the lease ended and retrying. A retry that
    # reached the gateway before it had seen the first attempt's client leave (the close and, on
    # Redis, the held record's write are asynchronous) was told "in progress, retry in 1 s".
    middle = result["attempts"][1:-1]
    assert all(a["status"] == 409 and a["retry_after"] == "1" for a in middle), json.dumps(result)
    assert 2 <= len(result["attempts"]) <= 3, json.dumps(result)
    print("\n%s SDK, default forwarding, %s store:\n%s" % (lang, store_of(gateway), json.dumps(result, indent=1)))


@pytest.mark.parametrize("lang", ["python", "node"])
def test_sdk_timeout_retry_gets_the_first_answer_with_detached_forwarding(gateway, upstream, lang):
    result = run_sdk(lang, gateway, "/sdk/detached", {"sku": new_key("sku")})
    key = result["idempotency_key"]
    assert result["ok"] is True and result["status"] == 200, json.dumps(result)
    body = result["body"]
    assert body["key"] == key and body["n"] == 1, "not the first execution's answer: %s" % json.dumps(result)
    statuses = [a["status"] for a in result["attempts"]]
    assert statuses[0] is None and statuses[-1] == 200, json.dumps(result)
    assert all(s == 409 for s in statuses[1:-1]), json.dumps(result)
    assert all(a["retry_after"] in (None, "1") for a in result["attempts"]), json.dumps(result)
    assert settle(upstream, key) == 1, "the business ran twice: %s" % json.dumps(result)
    print("\n%s SDK, detached forwarding, %s store:\n%s" % (lang, store_of(gateway), json.dumps(result, indent=1)))


def scripted_client(env, path, key, body, attempts=6):
    """What the SDKs do, written out: 1 s per attempt, honour Retry-After, stop on x-should-retry."""
    log = []
    for _ in range(attempts):
        try:
            r = env.request("POST", path, headers={"Idempotency-Key": key, "x-demo-delay-ms": str(DELAY_MS)},
                            body=body, timeout=SDK_TIMEOUT_S)
        except OSError as e:
            log.append(("timeout", type(e).__name__))
            time.sleep(0.5)  # the client's backoff after a timeout, as the SDKs do
            continue
        log.append((r.status, r.code, r.header("retry-after"), r.header("x-should-retry")))
        if r.status < 400 or r.header("x-should-retry") == "false" or r.status not in (409, 429, 503):
            return r, log
        time.sleep(int(r.header("retry-after") or "1"))  # the client honours Retry-After
    return None, log


def test_scripted_client_with_the_same_timing(gateway, upstream):
    key = new_key("scripted-inline")
    r, log = scripted_client(gateway, "/sdk/inline", key, {"sku": key})
    assert r is not None and r.status == 409 and r.code == "IDEMPOTENCY_OUTCOME_UNKNOWN", log
    assert settle(upstream, key) == 1, log
    key = new_key("scripted-detached")
    r, log = scripted_client(gateway, "/sdk/detached", key, {"sku": key})
    assert r is not None and r.status == 200, log
    assert r.json()["n"] == 1 and r.header("idempotent-replayed") == "true", describe(r)
    assert settle(upstream, key) == 1, log
    print("\nscripted client, %s store: %s" % (store_of(gateway), log))


def test_detached_answer_reaches_a_client_that_waits(gateway, upstream):
    """A client that waits long enough gets the upstream's own answer (not marked as a replay)."""
    key = new_key("patient")
    r = gateway.request("POST", "/sdk/detached", headers={"Idempotency-Key": key, "x-demo-delay-ms": "300",
                                                         "x-demo-set-cookie": "sid=1"},
                        body={"sku": key}, timeout=10)
    assert r.status == 200 and r.json()["n"] == 1, describe(r)
    assert r.header("idempotent-replayed") is None, describe(r)
    again = gateway.request("POST", "/sdk/detached", headers={"Idempotency-Key": key}, body={"sku": key})
    assert again.status == 200 and again.header("idempotent-replayed") == "true", describe(again)
    assert again.body == r.body, describe(again)
    assert executions(upstream, key) == 1


@pytest.fixture
def fast_upstream(workdir):
    """An Envoy answering every request itself at once: detached calls come back within the
    moment Envoy keeps a reset stream's context around."""
    env = stack.start_fast_upstream(workdir, concurrency=1)
    yield env
    env.stop()


@pytest.mark.wasm_only("forward = \"detached\"")
def test_clients_leaving_during_detached_calls_never_trap_the_vm(make_envoy, fast_upstream):
    """wrk's 32 connections close at the end of its run while the root's detached calls are out:
    the root must not answer a stream whose client reset it (Envoy still accepts the context for
    a moment, the SDK has deleted it, and a reply there trapped the VM — found by `make bench`).
    The worker keeps serving."""
    env = make_envoy(policy("shared"), ROUTES, upstream_port=fast_upstream.listen_port, concurrency=1)
    for i in range(3):
        res = stack.run_wrk(env.listen_port, "/sdk/detached", stack.WRK_SCRIPTS / "unique_keys.lua",
                            ["/sdk/detached", new_key("wrk%d" % i)], duration=1.0, connections=32, threads=1)
        assert res["requests"] > 0, res["raw"]
    key = new_key("after")
    r = env.request("POST", "/sdk/detached", headers={"Idempotency-Key": key}, body={"sku": "A1"})
    assert r.status == 200, describe(r)
    again = env.request("POST", "/sdk/detached", headers={"Idempotency-Key": key}, body={"sku": "A1"})
    assert again.header("idempotent-replayed") == "true", describe(again)
    log = env.log_text()
    assert "panic" not in log and "unreachable" not in log, env.log_tail(30)
