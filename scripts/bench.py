#!/usr/bin/env python3
"""idem benchmark (`make bench`): wrk against real Envoy, with and without the filter.

    python3 scripts/bench.py [--duration 2] [--reps 9] [--connections 32] [--json out.json] [--strict]

Topology for every case:  wrk -> Envoy under test (1 worker) -> fast upstream
The upstream is a second Envoy answering with `direct_response`, so the Python demo upstream
is never the bottleneck. Cases (run round-robin, `--reps` times each, medians reported):

  (a)  Envoy without the filter                                   baseline
  (b)  filter enabled on the route, no policy matches the request  target >= 0.95 x (a)
  (b') filter declared but disabled on the route (how the examples
       configure routes without a policy)                         informational
  (c0) the floor: a no-op Wasm filter doing what (c) makes Envoy do (bench/floor: pause at the
       headers, buffer and read the whole body, read the response as it streams, one filter
       state) without the idempotency work                       the floor for (c)
  (c0-native) the same no-op as a native Envoy dynamic module (bench/floor-native, a .so loaded by
       `envoy.filters.http.dynamic_modules`: no VM crossing); (c0) minus (c0-native) is what the
       Wasm VM costs a filter doing that much                    context only
  (c)  key mode, a fresh Idempotency-Key every request (claim + store) target >= 0.80 x (a), or
       within 10 % of the floor's cost per request
  (d)  key mode, the same key every request (replays)             target >= 0.90 x (a)
  (g)  key mode with `forward = "detached"` (the root context sends
       the request upstream itself), unique keys: the option's cost  informational
  (e0) the floor of (e): the no-op module of (c0) also making the two Webdis calls of a fresh key
       (one before forwarding, one holding the answer until it is answered)  the floor for (e)
  (e)  key mode on the Redis store (through Webdis), unique keys:
       claim + completion = two Webdis round trips + the upstream  target >= 0.45 x (a)
  (f)  key mode on the Redis store, replays (one Webdis round trip) target >= 0.80 x (a)
  (ec) (e) on a Redis Cluster (3 primaries, 3 replicas) reached through Envoy's redis_proxy
       (examples/redis-cluster/): one more hop per store call     target >= 0.90 x (e)'s ratio
  (fc) (f) on the Redis Cluster                                   target >= 0.90 x (f)'s ratio
  (w)  wrk straight against Webdis issuing the claim's
       `SET k v NX PX 30000 GET`: the store's own ceiling           context only
  (a16k) (c0-16k) (c16k), (a256k) (c0-256k) (c256k): (a), (c0), (c) with 16 KB and 256 KB orders —
       reading and fingerprinting a body, against the floor that only buffers and reads it
  (a-c4) (e0-c4) (e-c4): (a), (e0), (e) at 4 connections (a lightly loaded fleet store's latency)
  (e-native) (f-native) (e-native-c4): (e), (f), (e-c4) on the native build (the same Webdis)
  (e-direct) (e-direct-c4): (e-native), (e-native-c4) with `[redis] direct`: RESP, no Webdis
  (h)  held duplicates on Redis (`on_in_flight = "wait"`): 200 requests with one key while the
       first takes 2 s upstream; prints the Redis commands per held request and the wait

The Redis cases use a real redis-server and webdis (examples/webdis.json, ports rewritten) on
loopback, and their own Envoy (same worker count) with the `webdis` cluster; the cluster cases
another Envoy (its `webdis` cluster points at a Webdis in front of a redis_proxy Envoy, 1 worker).

The machine is small and shared: read the ratios, not the absolute numbers. Each case's ratio is
the median over repetitions of its req/s divided by (a)'s req/s *in the same repetition* (the cases
of one repetition run back to back), which cancels most of the drift of a noisy machine. The
"CPU/req" column is the Envoy-under-test's own CPU time per request (from /proc), a second view
that is much less sensitive to other load on the machine; "cost ratio" is (a)'s CPU/req divided by
the case's (what throughput would be if the proxy alone were the bottleneck).
"""

import argparse
import base64
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stack  # noqa: E402

# The measured routes, in the files the host-call budget test reads too (filter/src/testing/bench.rs).
SCENARIO = stack.REPO / "bench" / "scenario"
# The native build refuses `forward = "detached"` (docs/deploy.md): its Envoy gets the shared routes only.
SHARED_POLICY = (SCENARIO / "shared.toml").read_text()
POLICY = SHARED_POLICY + """
[[route]]
name = "bench-detached"
match = { method = "POST", path = "/api/order/detached" }
forward = "detached"

[route.key]
lock_ttl = "30s"
ttl = "24h"
"""

REDIS_POLICY = stack.redis_table(timeout="500ms", prefix="idem-bench:") + "\n" + (SCENARIO / "redis-route.toml").read_text()

WAIT_POLICY = stack.redis_table(timeout="500ms", prefix="idem-bench-wait:") + """
[[route]]
name = "bench-wait"
match = { method = "POST", path = "/api/order/create" }
store = "redis"

[route.key]
on_in_flight = "wait"
wait_timeout = "10s"
"""

ROUTES = [
    {"name": "bench-key", "match": {"path": "/api/order/create"}, "idem": True},
    {"name": "bench-detached", "match": {"path": "/api/order/detached"}, "idem": True},
    {"name": "bench-nopolicy", "match": {"path": "/api/no-policy"}, "idem": True},
    {"name": "bench-disabled", "match": {"prefix": "/"}, "idem": False},
]

CASES = [
    # id, label, which envoy, path, lua script, script args, target ratio, options (body bytes, connections)
    ("a", "Envoy without the filter", "plain", "/api/order/create", "plain_post.lua", None, None, {}),
    ("b", "filter on, route without policy", "idem", "/api/no-policy", "plain_post.lua", None, 0.95, {}),
    ("b'", "filter disabled on the route", "idem", "/api/other", "plain_post.lua", None, None, {}),
    ("c0", "floor: body-buffering no-op Wasm filter", "floor", "/api/order/create", "unique_keys.lua", "unique",
     None, {}),
    ("c0-native", "floor as a native dynamic module (no Wasm VM)", "floor-native", "/api/order/create",
     "unique_keys.lua", "unique", None, {}),
    ("c", "key mode, unique keys", "idem", "/api/order/create", "unique_keys.lua", "unique", 0.80, {}),
    ("d", "key mode, replays (same key)", "idem", "/api/order/create", "same_key.lua", "same", 0.90, {}),
    # idem's native build (the same core as an Envoy dynamic module, target/native): no Wasm VM.
    ("c-native", "(c) on the native build", "idem-native", "/api/order/create", "unique_keys.lua", "unique", 0.90,
     {}),
    ("d-native", "(d) on the native build", "idem-native", "/api/order/create", "same_key.lua", "same", None, {}),
    ("g", "key mode, forward = detached, unique keys", "idem", "/api/order/detached", "unique_keys.lua", "unique",
     None, {}),
    ("e0", "floor of (e): no-op filter + the same two Webdis calls", "floor-redis", "/api/order/create",
     "unique_keys.lua", "unique", None, {}),
    ("e", "Redis store, unique keys", "redis", "/api/order/create", "unique_keys.lua", "unique", 0.45, {}),
    ("f", "Redis store, replays (same key)", "redis", "/api/order/create", "same_key.lua", "same", 0.80, {}),
    ("ec", "Redis Cluster via redis_proxy, unique keys", "cluster", "/api/order/create", "unique_keys.lua", "unique",
     None, {}),
    ("fc", "Redis Cluster via redis_proxy, replays", "cluster", "/api/order/create", "same_key.lua", "same", None, {}),
    ("w", "wrk -> Webdis `SET NX PX GET` (store ceiling)", "webdis", "/", "webdis_set_nx.lua", "webdis", None, {}),
    # Body sizes (a ~100-byte order above): what reading and fingerprinting a body costs.
    ("a16k", "(a) with 16 KB orders", "plain", "/api/order/create", "plain_post.lua", None, None, {"body": 16384}),
    ("c0-16k", "(c0) with 16 KB orders", "floor", "/api/order/create", "unique_keys.lua", "unique", None,
     {"body": 16384}),
    ("c16k", "(c) with 16 KB orders", "idem", "/api/order/create", "unique_keys.lua", "unique", None, {"body": 16384}),
    ("c16k-native", "(c-native) with 16 KB orders", "idem-native", "/api/order/create", "unique_keys.lua", "unique",
     None, {"body": 16384}),
    ("a256k", "(a) with 256 KB orders", "plain", "/api/order/create", "plain_post.lua", None, None, {"body": 262144}),
    ("c0-256k", "(c0) with 256 KB orders", "floor", "/api/order/create", "unique_keys.lua", "unique", None,
     {"body": 262144}),
    ("c256k", "(c) with 256 KB orders", "idem", "/api/order/create", "unique_keys.lua", "unique", None,
     {"body": 262144}),
    # Redis at 4 connections: the latency of a lightly loaded fleet store.
    ("a-c4", "(a) at 4 connections", "plain", "/api/order/create", "plain_post.lua", None, None, {"connections": 4}),
    ("e0-c4", "(e0) at 4 connections", "floor-redis", "/api/order/create", "unique_keys.lua", "unique", None,
     {"connections": 4}),
    ("e-c4", "(e) at 4 connections", "redis", "/api/order/create", "unique_keys.lua", "unique", None,
     {"connections": 4}),
    # The Redis cases on the native build: the same policy and Webdis, no Wasm VM.
    ("e-native", "(e) on the native build", "redis-native", "/api/order/create", "unique_keys.lua", "unique", None,
     {}),
    ("f-native", "(f) on the native build", "redis-native", "/api/order/create", "same_key.lua", "same", None, {}),
    ("e-native-c4", "(e-native) at 4 connections", "redis-native", "/api/order/create", "unique_keys.lua", "unique",
     None, {"connections": 4}),
    # The native build speaking RESP to the same Redis itself (`[redis] direct`): no Webdis.
    ("e-direct", "(e-native) with [redis] direct", "redis-direct", "/api/order/create", "unique_keys.lua", "unique",
     None, {}),
    ("e-direct-c4", "(e-direct) at 4 connections", "redis-direct", "/api/order/create", "unique_keys.lua", "unique",
     None, {"connections": 4}),
]


def check_native_counted(env, route, sent):
    """Prints the native build's counters of `route` and fails the run if they saw fewer requests
    than wrk sent (a case that missed idem's route measured something else)."""
    found = env.stats("idem.%s." % route)
    print("idem.%s counters on the native build: %s" % (route, ", ".join(
        "%s=%d" % (k.split(".")[-1], v) for k, v in sorted(found.items()) if v)))
    counted = found.get("idem.%s.forwarded" % route, 0) + found.get("idem.%s.replayed" % route, 0)
    if counted < sent:
        raise stack.StackError("the native build's route %s counted %d requests, wrk sent %d: the native cases "
                               "missed idem's route" % (route, counted, sent))


CLK_TCK = os.sysconf("SC_CLK_TCK")
# IDEM_FLOOR_WASM: another build of it (as IDEM_WASM names another idem_filter.wasm)
FLOOR_WASM = Path(os.environ.get("IDEM_FLOOR_WASM",
                                  stack.REPO / "target" / "wasm32-wasip1" / "release" / "idem_floor.wasm"))
# (c0-native): bench/floor-native is its own Cargo workspace (not the root's), built to this directory.
NATIVE_FLOOR_MODULE = "idem_floor_native"
NATIVE_FLOOR = stack.REPO / "target" / "native-floor" / "release" / ("lib%s.so" % NATIVE_FLOOR_MODULE)
NATIVE_FLOOR_BUILD = ("CARGO_TARGET_DIR=target/native-floor cargo build --release "
                      "--manifest-path bench/floor-native/Cargo.toml")


def cpu_seconds(pid):
    """utime + stime of a process (all threads), in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def report_floor(by_case):
    """(c) against the floor (c0): how much of its cost is idem's own work."""
    if not all(k in by_case for k in ("a", "c", "c0")):
        return
    c, c0, a = by_case["c"], by_case["c0"], by_case["a"]
    extra_floor = c0["cpu_us_per_req"] - a["cpu_us_per_req"]
    extra_idem = c["cpu_us_per_req"] - a["cpu_us_per_req"]
    print("floor: (c0) ratio %.2f, +%.1f us Envoy CPU/req over (a); (c) ratio %.2f, +%.1f us; idem's own work "
          "%.1f us/req; (c) cost per request is %.0f %% over the floor's (target: (c) >= 0.80 or within 10 %%)" % (
              c0["ratio"], extra_floor, c["ratio"], extra_idem, c["cpu_us_per_req"] - c0["cpu_us_per_req"],
              100.0 * (c["cpu_us_per_req"] / c0["cpu_us_per_req"] - 1) if c0["cpu_us_per_req"] else 0.0))


def native_floor_config(listen_port, admin_port, upstream_port, routes=ROUTES):
    """The Envoy config of (c0-native): the routes and listeners of (c0), with the dynamic module in place
    of the Wasm filter (named `idem`, declared disabled, enabled on the same routes). Envoy finds
    lib<name>.so through ENVOY_DYNAMIC_MODULES_SEARCH_PATH (else its working directory) when the
    config loads. Also used by scripts/breakdown.py --envoy."""
    native = {
        "name": "idem",
        "disabled": True,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter",
            "dynamic_module_config": {"name": NATIVE_FLOOR_MODULE},
            "filter_name": "floor",
        },
    }
    cfg = stack.idem_config(listen_port=listen_port, admin_port=admin_port, upstream_port=upstream_port,
                            policy_toml="", routes=routes, with_filter=False, pre_filters=[native])
    enabled = {r["name"] for r in routes if r["idem"]}
    ingress = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    for route in ingress["route_config"]["virtual_hosts"][0]["routes"]:
        if route["name"] in enabled:
            route["typed_per_filter_config"] = stack.ENABLE_IDEM
    return cfg


def start_native_floor(workdir, upstream_port, concurrency):
    """The Envoy of (c0-native), started and checked: (Envoy, bytes the probe request read, Envoy's
    ABI version log lines)."""
    listen_port, admin_port = stack.free_port(), stack.free_port()
    cfg = native_floor_config(listen_port, admin_port, upstream_port)
    saved = os.environ.get("ENVOY_DYNAMIC_MODULES_SEARCH_PATH")
    os.environ["ENVOY_DYNAMIC_MODULES_SEARCH_PATH"] = str(NATIVE_FLOOR.parent)
    try:
        # dynamic_modules at info: the log keeps Envoy's "Dynamic module ABI version ..." line.
        env = stack.Envoy(cfg, workdir, concurrency=concurrency, name="envoy-floor-native",
                          wasm_log_level="info,dynamic_modules:info")
    finally:
        if saved is None:
            del os.environ["ENVOY_DYNAMIC_MODULES_SEARCH_PATH"]
        else:
            os.environ["ENVOY_DYNAMIC_MODULES_SEARCH_PATH"] = saved
    try:
        env.wait_ready(60)
        # Proof it runs: a probe request gets the bytes the module read back in a response header.
        body = b'{"sku":"A1","qty":1}'
        r = stack.request(env.listen_port, "POST", "/api/order/create",
                          {"content-type": "application/json", "x-floor-native-probe": "1"}, body)
        seen = r.header("x-floor-native-seen")
        if r.status != 200 or seen is None or int(seen) <= len(body):
            raise stack.StackError("(c0-native): the module did not run on the probe request: %r" % r)
    except Exception:
        env.stop()
        raise
    abi = [line for line in env.log_text().splitlines() if "ABI version" in line]
    return env, seen, abi


def report_native_floor(by_case):
    """The Wasm floor (c0) against the same work done natively (c0-native): the VM crossing's cost."""
    if not all(k in by_case for k in ("a", "c0", "c0-native")):
        return
    a, c0, nat = by_case["a"], by_case["c0"], by_case["c0-native"]
    print("native floor: (c0-native) ratio %.2f, %+.1f us Envoy CPU/req over (a); (c0) ratio %.2f, %+.1f us; "
          "the Wasm VM costs (c0) %.1f us/req over the same work done natively" % (
              nat["ratio"], nat["cpu_us_per_req"] - a["cpu_us_per_req"], c0["ratio"],
              c0["cpu_us_per_req"] - a["cpu_us_per_req"], c0["cpu_us_per_req"] - nat["cpu_us_per_req"]))


def report_native_build(by_case):
    """idem's native build (c-native) against plain Envoy (a), the .wasm (c) and the native floor."""
    if not all(k in by_case for k in ("a", "c", "c-native")):
        return
    a, c, nat = by_case["a"], by_case["c"], by_case["c-native"]
    line = ("native build: (c-native) %.2f of plain Envoy's req/s (target >= 0.90), %+.1f %% CPU/req over (a) "
            "(target within 15 %%); (c) on the .wasm %.2f, %+.1f %%" % (
                nat["ratio"], 100.0 * (nat["cpu_us_per_req"] / a["cpu_us_per_req"] - 1), c["ratio"],
                100.0 * (c["cpu_us_per_req"] / a["cpu_us_per_req"] - 1)))
    if "c0-native" in by_case:
        floor = by_case["c0-native"]
        line += "; (c-native) %+.1f us CPU/req over its floor (c0-native)" % (
            nat["cpu_us_per_req"] - floor["cpu_us_per_req"])
    print(line)


def report_body_sizes(by_case):
    """(c) against its floor (c0) at each body size, in Envoy CPU per request."""
    for size, c0, c in (("~100 B", "c0", "c"), ("16 KB", "c0-16k", "c16k"), ("256 KB", "c0-256k", "c256k")):
        if c0 in by_case and c in by_case:
            f, m = by_case[c0]["cpu_us_per_req"], by_case[c]["cpu_us_per_req"]
            print("body %-6s: (%s) %.1f us CPU/req against its floor (%s) %.1f us: %+.0f %%" % (
                size, c, m, c0, f, (m / f - 1) * 100 if f else 0))


def webdis_calls(env):
    """Requests Envoy has sent to its `webdis` cluster (None for an Envoy without one)."""
    if env is None:
        return None
    r = env.admin("/stats?filter=%5Ecluster%5C.webdis%5C.upstream_rq_total%24")
    for line in r.body.decode(errors="replace").splitlines():
        name, _, value = line.partition(": ")
        if name.strip() == "cluster.webdis.upstream_rq_total":
            return int(value)
    return None


def report_redis_floor(by_case):
    """(e) against its floor (e0): how much of the Redis path is idem's own work."""
    if not all(k in by_case for k in ("a", "e", "e0")):
        return
    e, e0, a = by_case["e"], by_case["e0"], by_case["a"]
    print("Redis floor: (e0) ratio %.2f, +%.1f us Envoy CPU/req over (a); (e) ratio %.2f, +%.1f us; idem's own work "
          "%.1f us/req; (e) cost per request is %.0f %% over the floor's" % (
              e0["ratio"], e0["cpu_us_per_req"] - a["cpu_us_per_req"], e["ratio"],
              e["cpu_us_per_req"] - a["cpu_us_per_req"], e["cpu_us_per_req"] - e0["cpu_us_per_req"],
              100.0 * (e["cpu_us_per_req"] / e0["cpu_us_per_req"] - 1) if e0["cpu_us_per_req"] else 0.0))


def report_native_redis(by_case):
    """The Redis path on the native build against the .wasm's (e) and the floor (e0): Envoy CPU per
    request and, at 4 connections, p50."""
    for native, wasm, floor in (("e-native", "e", "e0"), ("e-native-c4", "e-c4", "e0-c4"), ("e-direct", "e", "e0"),
                                ("e-direct-c4", "e-c4", "e0-c4")):
        if native not in by_case or wasm not in by_case:
            continue
        n, w = by_case[native], by_case[wasm]
        f = by_case.get(floor)
        against_floor = (", (%s) %.1f us, p50 %.2f ms" % (floor, f["cpu_us_per_req"], f["p50_ms"])) if f else ""
        print("(%s): %.1f us Envoy CPU/req, p50 %.2f ms; (%s) %.1f us, p50 %.2f ms%s" % (
            native, n["cpu_us_per_req"], n["p50_ms"], wasm, w["cpu_us_per_req"], w["p50_ms"], against_floor))


def report_fleet(by_case):
    """The Redis Cluster path against the single node."""
    for fleet, single in (("ec", "e"), ("fc", "f")):
        if fleet not in by_case or single not in by_case:
            continue
        rel = by_case[fleet]["ratio"] / by_case[single]["ratio"] if by_case[single]["ratio"] else 0.0
        by_case[fleet]["vs_single_node"] = rel
        print("Redis Cluster path vs single node: (%s)/(%s) = %.2f (target >= 0.90) %s" % (
            fleet, single, rel, "ok" if rel >= 0.90 else "MISSED"))


def held_burst(env, redis, n=200, delay_ms=2000):
    """(h): one request with a fresh key takes `delay_ms` upstream; `n - 1` duplicates arrive while
    it is in flight and are held. Returns what Redis did meanwhile, per held request."""
    import concurrent.futures
    key = "bench-held-%s" % uuid.uuid4().hex[:8]
    hdrs = {"Idempotency-Key": key, "Content-Type": "application/json", "Authorization": "Bearer bench",
            "x-demo-delay-ms": str(delay_ms)}
    body = b'{"sku":"A1","qty":1}'
    before = store_reading((None, redis))
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
        first = pool.submit(stack.request, env.listen_port, "POST", "/api/order/create", hdrs, body, 30.0)
        time.sleep(0.3)  # the first request has claimed the key
        held = [pool.submit(stack.request, env.listen_port, "POST", "/api/order/create", hdrs, body, 30.0)
                for _ in range(n - 1)]
        answers = [f.result() for f in held]
        first_answer = first.result()
    elapsed = time.monotonic() - t0
    after = store_reading((None, redis))
    commands = after[2] - before[2] - 1
    replayed = sum(1 for r in answers if r.status == 200 and r.header("idempotent-replayed") == "true")
    if first_answer.status != 200 or replayed != n - 1:
        raise stack.StackError("(h): the first answered %d, %d of %d held duplicates were replayed"
                               % (first_answer.status, replayed, n - 1))
    return {"held": n - 1, "redis_commands": commands, "commands_per_held": commands / (n - 1),
            "seconds": elapsed, "redis_cpu_s": after[1] - before[1]}


def store_reading(side):
    """(Webdis CPU s, Redis CPU s, Redis commands processed, Redis read events) for a case's store
    side, or None. Commands count a script's own calls too; a read event is what Redis read from a
    client at once: a command alone, or a whole pipeline (one round trip)."""
    if not side:
        return None
    webdis_pid, redis = side
    info = redis.command("INFO", "stats").decode()

    def stat(name):
        return int(next(line.split(":")[1] for line in info.splitlines() if line.startswith(name + ":")))
    return (cpu_seconds(webdis_pid) if webdis_pid else 0.0, cpu_seconds(redis.proc.pid),
            stat("total_commands_processed"), stat("total_reads_processed"))


def main():
    ap = argparse.ArgumentParser(description="idem benchmark")
    ap.add_argument("--duration", type=float, default=2.0, help="seconds per measured run (default 2)")
    ap.add_argument("--reps", type=int, default=9, help="measured runs per case (default 9)")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="wrk threads (default 1)")
    ap.add_argument("--workers", type=int, default=1, help="Envoy-under-test worker threads (default 1)")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument("--cases", help="comma-separated case ids to run (default: all; (a) and (b') always run)")
    args = ap.parse_args()
    cases = CASES
    if args.cases:
        wanted = set(args.cases.split(",")) | {"a", "b'"}
        unknown = wanted - {c[0] for c in CASES} - {"h"}
        if unknown:
            print("error: unknown case(s) %s; cases are %s" % (", ".join(sorted(unknown)),
                                                              ", ".join(c[0] for c in CASES)), file=sys.stderr)
            return 2
        cases = [c for c in CASES if c[0] in wanted]

    stack.require_envoy()
    stack.require_wasm()
    stack.require_wrk()
    stack.require_redis()
    if any(c[0] == "c0-native" for c in cases) and not NATIVE_FLOOR.is_file():
        if args.cases:
            print("error: %s is missing; build it with `%s`" % (NATIVE_FLOOR, NATIVE_FLOOR_BUILD), file=sys.stderr)
            return 2
        print("warning: %s is missing, (c0-native) is skipped; build it with `%s`" % (NATIVE_FLOOR, NATIVE_FLOOR_BUILD),
              file=sys.stderr)
        cases = [c for c in cases if c[0] != "c0-native"]
    if not FLOOR_WASM.is_file():
        print("error: %s is missing; build it with `cargo build --release --target wasm32-wasip1 -p idem-floor` "
              "(make bench does)" % FLOOR_WASM, file=sys.stderr)
        return 2
    workdir = stack.make_workdir("idem-bench-")
    procs = []
    try:
        fast = stack.start_fast_upstream(workdir, concurrency=1)
        procs.append(fast)
        plain = stack.start_idem_envoy(workdir, fast.listen_port, "", routes=ROUTES, with_filter=False,
                                       concurrency=args.workers)
        procs.append(plain)
        idem = stack.start_idem_envoy(workdir, fast.listen_port, POLICY, routes=ROUTES, concurrency=args.workers)
        procs.append(idem)
        floor = stack.start_idem_envoy(workdir, fast.listen_port, "", routes=ROUTES, concurrency=args.workers,
                                       wasm_path=FLOOR_WASM, name="envoy-floor")
        procs.append(floor)
        redis = stack.Redis(workdir)
        procs.append(redis)
        webdis = stack.Webdis(workdir, redis.port)
        procs.append(webdis)
        redis_env = stack.start_idem_envoy(workdir, fast.listen_port, REDIS_POLICY, routes=ROUTES,
                                           concurrency=args.workers, extra_clusters=[stack.webdis_cluster(webdis.port)],
                                           name="envoy-idem-redis")
        procs.append(redis_env)
        cluster = stack.RedisCluster(workdir)
        procs.append(cluster)
        cluster_store = stack.ClusterStore(workdir, cluster)
        procs.append(cluster_store)
        cluster_env = stack.start_idem_envoy(workdir, fast.listen_port, REDIS_POLICY, routes=ROUTES,
                                             concurrency=args.workers,
                                             extra_clusters=[stack.webdis_cluster(cluster_store.webdis.port)],
                                             name="envoy-idem-cluster")
        procs.append(cluster_env)
        demo_upstream = stack.Upstream(workdir)
        procs.append(demo_upstream)
        wait_env = stack.start_idem_envoy(workdir, demo_upstream.port, WAIT_POLICY, routes=ROUTES,
                                          concurrency=args.workers, extra_clusters=[stack.webdis_cluster(webdis.port)],
                                          name="envoy-idem-wait")
        procs.append(wait_env)
        webdis_auth = base64.b64encode(stack.WEBDIS_AUTH.encode()).decode()
        floor_redis = stack.start_idem_envoy(workdir, fast.listen_port, "callouts webdis %s" % webdis_auth,
                                             routes=ROUTES, concurrency=args.workers, wasm_path=FLOOR_WASM,
                                             extra_clusters=[stack.webdis_cluster(webdis.port)],
                                             name="envoy-floor-redis")
        procs.append(floor_redis)
        envoys = {"plain": plain, "idem": idem, "floor": floor, "floor-redis": floor_redis, "redis": redis_env, "cluster": cluster_env}
        if any(c[2] == "idem-native" for c in cases):
            # The same policy and routes as (c), on the native build.
            envoys["idem-native"] = stack.start_idem_envoy(workdir, fast.listen_port, SHARED_POLICY, routes=ROUTES,
                                                           concurrency=args.workers, wasm_path=stack.NATIVE,
                                                           name="envoy-idem-native")
            procs.append(envoys["idem-native"])
        # The Redis route on the native build: through the same Webdis, or speaking RESP itself.
        direct_policy = stack.redis_table(timeout="500ms", prefix="idem-bench:", direct_port=redis.port) + "\n" + (
            SCENARIO / "redis-route.toml").read_text()
        for which, policy in (("redis-native", REDIS_POLICY), ("redis-direct", direct_policy)):
            if any(c[2] == which for c in cases):
                envoys[which] = stack.start_idem_envoy(
                    workdir, fast.listen_port, policy, routes=ROUTES, concurrency=args.workers,
                    extra_clusters=[stack.webdis_cluster(webdis.port)], wasm_path=stack.NATIVE,
                    name="envoy-idem-%s" % which)
                procs.append(envoys[which])
        if any(c[0] == "c0-native" for c in cases):
            floor_native, probe_seen, abi_lines = start_native_floor(workdir, fast.listen_port, args.workers)
            procs.append(floor_native)
            envoys["floor-native"] = floor_native
            print("(c0-native): %s loaded; a probe request read %s bytes through it; Envoy: %s" % (
                NATIVE_FLOOR.name, probe_seen, " / ".join(abi_lines) or "(no ABI version line)"))
        # (port, pid) of what wrk talks to; CPU/req is that process's CPU time.
        targets = {name: (env.listen_port, env.proc.pid) for name, env in envoys.items()}
        targets["webdis"] = (webdis.port, webdis.proc.pid)
        # The store side of the Redis cases: Webdis' and Redis' CPU, and Redis commands, per request.
        store_side = {"redis": (webdis.proc.pid, redis), "floor-redis": (webdis.proc.pid, redis),
                      "redis-native": (webdis.proc.pid, redis), "redis-direct": (webdis.proc.pid, redis),
                      "webdis": (None, redis)}
        print("wrk -t%d -c%d, %gs x %d per case, Envoy under test: %d worker(s); upstream: direct_response Envoy"
              % (args.threads, args.connections, args.duration, args.reps, args.workers))
        print("generated Envoy configs and logs: %s" % workdir)

        run_id = uuid.uuid4().hex[:8]
        results = {c[0]: [] for c in CASES}
        counter = [0]

        def run(case, duration):
            cid, _, which, path, script, mode, _, opts = case
            counter[0] += 1
            port, pid = targets[which]
            body = [str(opts["body"])] if "body" in opts else []
            if mode == "unique":
                sargs = [path, "%s-%d" % (run_id, counter[0])] + body
            elif mode == "webdis":
                sargs = ["%s-%d" % (run_id, counter[0]), webdis_auth]
            elif mode == "same":
                key = "bench-replay-%s" % run_id
                sargs = [path, key]
                # (Re)store the replay key first: the unique-key case churns the store and may have
                # evicted it, and 32 connections racing for a fresh key would measure 409s, not replays.
                hdrs = {"Idempotency-Key": key, "Content-Type": "application/json", "Authorization": "Bearer bench"}
                r = stack.request(port, "POST", path, hdrs, b'{"sku":"A1","qty":1}')
                if r.status != 200:
                    raise stack.StackError("priming the replay key failed: %r" % r)
                # Wait until the stored answer is visible (on the Redis store the completion may land
                # just after the client got its answer).
                if not stack.wait_until(lambda: stack.request(port, "POST", path, hdrs, b'{"sku":"A1","qty":1}')
                                        .header("idempotent-replayed") == "true", 5):
                    raise stack.StackError("the replay key is not replayed after priming")
            else:
                sargs = [path] + body
            side = store_side.get(which)
            calls0 = webdis_calls(envoys.get(which))
            before = store_reading(side)
            cpu0 = cpu_seconds(pid)
            res = stack.run_wrk(port, path, stack.WRK_SCRIPTS / script, sargs, duration=duration,
                                connections=opts.get("connections", args.connections), threads=args.threads)
            n = max(1, res["requests"])
            res["cpu_us_per_req"] = (cpu_seconds(pid) - cpu0) * 1e6 / n
            if calls0 is not None:
                res["callouts_per_req"] = (webdis_calls(envoys.get(which)) - calls0) / n
            if side:
                after = store_reading(side)
                res["webdis_us_per_req"] = (after[0] - before[0]) * 1e6 / n
                res["redis_us_per_req"] = (after[1] - before[1]) * 1e6 / n
                # minus the INFO that took the reading
                res["redis_cmds_per_req"] = (after[2] - before[2] - 1) / n
                res["redis_reads_per_req"] = (after[3] - before[3] - 1) / n
            return res

        # warm-up: JIT tiers, connection pools, the replay key's first (stored) answer
        for case in cases:
            run(case, 1)
        for rep in range(args.reps):
            for case in cases:
                res = run(case, args.duration)
                results[case[0]].append(res)
                bad = res["non_2xx"] + res["socket_errors"]
                print("  rep %d %-4s %9.0f req/s  p50 %6.2f ms  p99 %6.2f ms  %5.1f us CPU/req%s" % (
                    rep + 1, "(%s)" % case[0], res["rps"], res["p50_ms"] or 0, res["p99_ms"] or 0,
                    res["cpu_us_per_req"],
                    "  (%d non-2xx/socket errors)" % bad if bad else ""), flush=True)
                time.sleep(0.3)

        reuse = []
        for name, env in sorted(envoys.items()):
            opened, sent = env.check_upstream_reused()
            if sent:
                reuse.append("%s %d for %d" % (name, opened, sent))
        print("upstream connections opened for requests sent: " + ", ".join(reuse))

        burst = None
        if not args.cases or "h" in args.cases.split(","):
            burst = held_burst(wait_env, redis)

        counters = idem.stats("idem.bench-key.")
        counters.update(idem.stats("idem.bench-detached."))
        redis_counters = redis_env.stats("idem.bench-redis.")
        table = []
        base_runs = results["a"]
        base_cpu = statistics.median(r["cpu_us_per_req"] for r in base_runs)
        for cid, label, _, _, _, _, target, _ in cases:
            runs = results[cid]
            cpu = statistics.median(r["cpu_us_per_req"] for r in runs)
            row = {"case": cid, "label": label,
                   "rps": statistics.median(r["rps"] for r in runs),
                   "p50_ms": statistics.median(r["p50_ms"] or 0 for r in runs),
                   "p99_ms": statistics.median(r["p99_ms"] or 0 for r in runs),
                   # paired: each repetition's req/s over (a)'s req/s in the same repetition
                   "ratio": statistics.median(r["rps"] / b["rps"] for r, b in zip(runs, base_runs) if b["rps"]),
                   "cpu_us_per_req": cpu, "cost_ratio": base_cpu / cpu if cpu else 0.0,
                   "target": target,
                   "errors": sum(r["non_2xx"] + r["socket_errors"] for r in runs),
                   "runs_rps": [r["rps"] for r in runs]}
            row["meets"] = None if target is None else row["ratio"] >= target
            for k in ("webdis_us_per_req", "redis_us_per_req", "redis_cmds_per_req", "redis_reads_per_req",
                      "callouts_per_req"):
                if k in runs[0]:
                    row[k] = statistics.median(r[k] for r in runs)
            table.append(row)
        base = table[0]
        for r in table:
            # what the filter adds to a request's latency, against (a) of the same run
            r["added_p50_ms"] = r["p50_ms"] - base["p50_ms"]
            r["added_p99_ms"] = r["p99_ms"] - base["p99_ms"]

        print()
        print("| case | what | req/s (median) | p50 ms | p99 ms | added p50 / p99 ms | ratio to (a) | target | "
              "| CPU/req | cost ratio |")
        print("|---|---|---:|---:|---:|---:|---:|---|---|---:|---:|")
        for r in table:
            verdict = "" if r["meets"] is None else ("ok" if r["meets"] else "MISSED")
            added = "" if r is base else "%+.2f / %+.2f" % (r["added_p50_ms"], r["added_p99_ms"])
            print("| (%s) | %s | %.0f | %.2f | %.2f | %s | %.2f | %s | %s | %.1f us | %.2f |" % (
                r["case"], r["label"], r["rps"], r["p50_ms"], r["p99_ms"], added, r["ratio"],
                ">= %.2f" % r["target"] if r["target"] else "", verdict, r["cpu_us_per_req"], r["cost_ratio"]))
        for r in table:
            if "redis_cmds_per_req" in r:
                print("store side of (%s): %.2f Redis commands/req (a script's own calls included), %.2f Redis "
                      "round trips/req (read events: a pipeline is one), Webdis %.1f us CPU/req, Redis %.1f us CPU/req"
                      % (r["case"], r["redis_cmds_per_req"], r["redis_reads_per_req"], r.get("webdis_us_per_req", 0.0),
                         r["redis_us_per_req"]))
        for r in table:
            if "callouts_per_req" in r:
                print("(%s): %.2f Webdis callouts per request" % (r["case"], r["callouts_per_req"]))
        print("\nidem.bench-key counters: %s" % ", ".join("%s=%d" % (k.split(".")[-1], v)
                                                      for k, v in sorted(counters.items()) if v))
        print("idem.bench-redis counters: %s" % ", ".join("%s=%d" % (k.split(".")[-1], v)
                                                        for k, v in sorted(redis_counters.items()) if v))
        for which, route in (("idem-native", "bench-key"), ("redis-native", "bench-redis"),
                             ("redis-direct", "bench-redis")):
            if which in envoys:
                sent = sum(r["requests"] for c in cases if c[2] == which for r in results[c[0]])
                check_native_counted(envoys[which], route, sent)
        by_case = {r["case"]: r for r in table}
        report_floor(by_case)
        report_native_floor(by_case)
        report_native_build(by_case)
        report_body_sizes(by_case)
        report_redis_floor(by_case)
        report_native_redis(by_case)
        report_fleet(by_case)
        if burst:
            print("(h) held duplicates on Redis: %d held while the first took 2 s; %d Redis commands in all "
                  "(the first's claim and completion included) = %.2f per held request (each held request's own "
                  "claim is 1; polls are shared per key and back off), done in %.1f s" % (
                      burst["held"], burst["redis_commands"], burst["commands_per_held"], burst["seconds"]))
        print("(w) is wrk straight to Webdis (its CPU/req is Webdis' own); (e)/(f) CPU/req is their Envoy's only, "
              "not Webdis' or Redis'.")
        control = next(r for r in table if r["case"] == "b'")
        print("noise floor of this run: (b') does the same work as (a) (the filter never runs on its route); "
              "its ratio %.2f and cost ratio %.2f show how far 1.00 moves by chance here." % (
                  control["ratio"], control["cost_ratio"]))
        errors = [r for r in table if r["errors"]]
        for r in errors:
            print("warning: case (%s) saw %d non-2xx answers or socket errors" % (r["case"], r["errors"]))
        if args.json:
            Path(args.json).write_text(json.dumps({"cases": table, "counters": counters, "held_burst": burst,
                                                   "redis_counters": redis_counters,
                                                   "duration_s": args.duration, "reps": args.reps,
                                                   "connections": args.connections}, indent=2))
        missed = [r for r in table if r["meets"] is False or r.get("vs_single_node", 1.0) < 0.90]
        if missed and args.strict:
            return 1
        return 0
    except stack.StackError as e:
        print("error: %s" % e, file=sys.stderr)
        return 2
    finally:
        for p in reversed(procs):
            p.stop()


if __name__ == "__main__":
    sys.exit(main())
