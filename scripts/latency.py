#!/usr/bin/env python3
"""Latency as users measure it (issue 57): p50 / p99 / p99.9 at fixed request rates, open loop,
each case against plain Envoy at the same rate in the same run.

`oha` (crates.io, installed here with `cargo install oha --locked` when missing) sends requests at
a fixed rate whatever the answers' speed (`-q`), with coordinated-omission correction
(`--latency-correction`): a slow answer delays no later request, and the requests that should
have been sent meanwhile count their wait. One Envoy worker per Envoy under test; the upstream is
a `direct_response` Envoy answering at once; everything shares this machine's cores.

Cases: (a) plain Envoy; (c) fresh keys on the shared store; (d) one key replayed; (e) fresh keys
on Redis through Webdis; (e0) its floor: the no-op Wasm module of `bench/floor` making the same
two Webdis calls per request with none of idem's work (what any gateway-side Redis check through
Webdis adds; its requests are checked against the Webdis cluster's call count instead); (c16k) (c)
with 16 KB bodies; (c-native), (d-native), (e-native) and
(e-direct: `[redis] direct`, RESP with no Webdis) on the native build. The key is a query parameter (`?k=…`): oha varies the URL by a regex
(`--rand-regex-url`, where `?` is escaped and `.` is not: oha treats dots as literal, and `\.`
turns the host into random characters), so every case's requests are checked against idem's own `idem_requests_total`
and a case that missed its route fails the run.

The ladder: 500, 1000, 2000, 4000 req/s and on until plain Envoy itself stops keeping up (achieves
under 90 % of the rate asked). Prints the table (and `--json`), and draws p99 against rate per case
into `--plot` (PNG, matplotlib, installed into .venv when missing).
"""

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stack  # noqa: E402

# The floor of (e) (`bench/floor`, built by `make bench`; IDEM_FLOOR_WASM names another build).
FLOOR_WASM = Path(os.environ.get("IDEM_FLOOR_WASM",
                                 stack.REPO / "target" / "wasm32-wasip1" / "release" / "idem_floor.wasm"))
RATES = [500, 1000, 2000, 4000, 6000, 8000, 12000, 16000]
KNEE_P99_MS = 5.0
PATH = "/api/order/create"

SHARED = """
[shared]
buckets = 16384
entries_per_bucket = 8
max_response_bytes = 4096

[[route]]
name = "lat-key"
match = { method = "POST", path = "/api/order/create" }

[route.key]
from = "query"
name = "k"
lock_ttl = "30s"
ttl = "10m"
"""

REDIS_ROUTE = """
[[route]]
name = "lat-key"
match = { method = "POST", path = "/api/order/create" }
store = "redis"

[route.key]
from = "query"
name = "k"
lock_ttl = "30s"
ttl = "10m"
"""
REDIS = stack.redis_table(timeout="500ms", prefix="idem-lat:") + REDIS_ROUTE

ROUTES = [{"name": "lat-key", "match": {"path": PATH}, "idem": True}]

# id, what, which Envoy, fresh keys?, body bytes
CASES = [
    ("a", "plain Envoy", "plain", True, 0),
    ("c", "fresh keys, shared store (.wasm)", "idem", True, 0),
    ("d", "one key replayed (.wasm)", "idem", False, 0),
    ("e", "fresh keys, Redis via Webdis (.wasm)", "redis", True, 0),
    ("e0", "floor of (e): a no-op Wasm filter making the same two Webdis calls", "floor-redis", True, 0),
    ("c16k", "(c) with 16 KB bodies", "idem", True, 16384),
    ("c-native", "fresh keys, shared store (native)", "native", True, 0),
    ("d-native", "one key replayed (native)", "native", False, 0),
    ("e-native", "fresh keys, Redis via Webdis (native)", "redis-native", True, 0),
    ("e-direct", "fresh keys, Redis spoken directly (native, [redis] direct)", "redis-direct", True, 0),
]


def oha_binary():
    """oha from crates.io: ~/.cargo/bin/oha, installed (pinned by its lock file) when missing."""
    found = shutil.which("oha") or str(Path.home() / ".cargo" / "bin" / "oha")
    if not Path(found).is_file():
        print("latency: installing oha (cargo install oha --locked) ...", flush=True)
        subprocess.run(["cargo", "install", "oha", "--locked", "--quiet"], check=True)
    return found


def body_of(size):
    head, tail = '{"sku":"A1","qty":1,"note":"', '"}'
    return '{"sku":"A1","qty":1}' if size <= 0 else head + "x" * (size - len(head) - len(tail)) + tail


def run_oha(oha, port, rate, seconds, fresh, body, run_id):
    base = "http://127.0.0.1:%d%s" % (port, PATH)
    argv = [oha, "--no-tui", "--output-format", "json", "-q", str(rate), "-z", "%ds" % seconds,
            "--latency-correction", "-c", str(max(16, min(256, rate // 25))), "-m", "POST",
            "-H", "content-type: application/json", "-H", "authorization: Bearer lat", "-d", body]
    if fresh:
        # The URL is a regex: `?` is escaped; dots are literal already (oha disables `.` in it, and
        # an escaped `\.` turns the host into random characters: `--dump-urls` shows it).
        argv += ["--rand-regex-url", base + r"\?k=" + run_id + "[a-z0-9]{20}"]
    else:
        argv += [base + "?k=replay-" + run_id]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    j = json.loads(out.stdout)
    pct = j["latencyPercentiles"]
    codes = j.get("statusCodeDistribution", {})
    return {
        "rate": rate,
        "rps": j["summary"]["requestsPerSec"],
        "requests": sum(int(v) for v in codes.values()),
        "non_2xx": sum(int(v) for k, v in codes.items() if not k.startswith("2")),
        "p50": pct["p50"] * 1000, "p99": pct["p99"] * 1000, "p999": pct["p99.9"] * 1000,
    }


def counted(env, which):
    """Every request idem's route counted (forwarded, replayed, ...): what the case sent through it.
    The floor has no counters: its requests are its Webdis calls, two each."""
    if which == "floor-redis":
        return env.stats("cluster.webdis.upstream_rq_total").get("cluster.webdis.upstream_rq_total", 0) // 2
    return sum(env.stats("idem.lat-key.").values())


def plot(results, path):
    """p99 against rate per case, as a PNG (matplotlib, installed into .venv when missing)."""
    try:
        import matplotlib
    except ImportError:
        print("latency: installing matplotlib into .venv (the plot) ...", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "matplotlib"], check=True)
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for case, rows in results.items():
        ax.plot([r["rate"] for r in rows], [r["p99"] for r in rows], marker="o", label="(%s)" % case)
    ax.axhline(KNEE_P99_MS, color="grey", linestyle=":", label="p99 = %g ms" % KNEE_P99_MS)
    ax.set_xlabel("requests per second (open loop)")
    ax.set_ylabel("p99 latency, ms (log)")
    ax.set_yscale("log")
    ax.set_title("idem: p99 against rate, one Envoy worker")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=8, help="seconds per rate (default 8)")
    ap.add_argument("--cases", default=",".join(c[0] for c in CASES))
    ap.add_argument("--rates", help="comma-separated rates (default: the ladder, until plain Envoy saturates)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--plot", default=str(stack.REPO / "docs" / "latency.png"), help="the PNG (default docs/latency.png)")
    args = ap.parse_args()
    wanted = set(args.cases.split(",")) | {"a"}
    cases = [c for c in CASES if c[0] in wanted]
    rates = [int(r) for r in args.rates.split(",")] if args.rates else RATES
    stack.require_envoy()
    oha = oha_binary()
    version = subprocess.run([oha, "--version"], capture_output=True, text=True).stdout.strip()
    load_before = os.getloadavg()
    workdir = stack.make_workdir("idem-latency-")
    procs, envs = [], {}
    try:
        fast = stack.start_fast_upstream(workdir, concurrency=1)
        procs.append(fast)
        envs["plain"] = stack.start_idem_envoy(workdir, fast.listen_port, "", routes=ROUTES, with_filter=False,
                                               concurrency=1, name="envoy-plain")
        envs["idem"] = stack.start_idem_envoy(workdir, fast.listen_port, SHARED, routes=ROUTES, concurrency=1)
        if any(c[2] in ("redis", "floor-redis", "redis-native", "redis-direct") for c in cases):
            redis = stack.Redis(workdir)
            webdis = stack.Webdis(workdir, redis.port)
            procs += [redis, webdis]
            envs["redis"] = stack.start_idem_envoy(workdir, fast.listen_port, REDIS, routes=ROUTES, concurrency=1,
                                                   extra_clusters=[stack.webdis_cluster(webdis.port)],
                                                   name="envoy-idem-redis")
        if any(c[2] == "floor-redis" for c in cases):
            if not FLOOR_WASM.is_file():
                raise stack.StackError("%s is missing: build it with `cargo build --release --target wasm32-wasip1 "
                                       "-p idem-floor` (make bench does)" % FLOOR_WASM)
            auth = base64.b64encode(stack.WEBDIS_AUTH.encode()).decode()
            envs["floor-redis"] = stack.start_idem_envoy(workdir, fast.listen_port, "callouts webdis %s" % auth,
                                                         routes=ROUTES, concurrency=1, wasm_path=FLOOR_WASM,
                                                         extra_clusters=[stack.webdis_cluster(webdis.port)],
                                                         name="envoy-floor-redis")
        if any(c[2] == "redis-native" for c in cases):
            envs["redis-native"] = stack.start_idem_envoy(workdir, fast.listen_port, REDIS, routes=ROUTES,
                                                          concurrency=1, wasm_path=stack.NATIVE,
                                                          extra_clusters=[stack.webdis_cluster(webdis.port)],
                                                          name="envoy-idem-redis-native")
        if any(c[2] == "redis-direct" for c in cases):
            direct = stack.redis_table(timeout="500ms", prefix="idem-lat:", direct_port=redis.port) + REDIS_ROUTE
            envs["redis-direct"] = stack.start_idem_envoy(workdir, fast.listen_port, direct, routes=ROUTES,
                                                          concurrency=1, wasm_path=stack.NATIVE,
                                                          name="envoy-idem-redis-direct")
        if any(c[2] == "native" for c in cases):
            envs["native"] = stack.start_idem_envoy(workdir, fast.listen_port, SHARED, routes=ROUTES, concurrency=1,
                                                    wasm_path=stack.NATIVE, name="envoy-idem-native")
        procs += list(envs.values())
        print("oha %s, open loop with latency correction, %d s per rate, one Envoy worker each; %d cores, "
              "load average before %.2f %.2f %.2f" % (version, args.seconds, os.cpu_count(), *load_before))
        results = {c[0]: [] for c in cases}
        run_id = uuid.uuid4().hex[:6]
        # Warm-up: connection pools, the replay keys' first (stored) answers, caches.
        for cid, _, which, fresh, size in cases:
            run_oha(oha, envs[which].listen_port, 500, 2, fresh, body_of(size), run_id + cid.replace("-", ""))
        for rate in rates:
            saturated = False
            for cid, _, which, fresh, size in cases:
                env = envs[which]
                before = counted(env, which) if which != "plain" else None
                r = run_oha(oha, env.listen_port, rate, args.seconds, fresh, body_of(size), run_id + cid.replace("-", ""))
                if which != "plain":
                    # Envoy counts a request once its stream ends: give the last ones a moment.
                    stack.wait_until(lambda: counted(env, which) - before >= r["requests"], 5)
                    seen = counted(env, which) - before
                    if seen < r["requests"]:
                        raise stack.StackError("(%s) at %d req/s: idem counted %d of %d requests: the case missed "
                                               "its route" % (cid, rate, seen, r["requests"]))
                results[cid].append(r)
                print("  %6d req/s  (%s)%s achieved %7.0f  p50 %7.2f  p99 %7.2f  p99.9 %7.2f ms%s" % (
                    rate, cid, " " * (9 - len(cid)), r["rps"], r["p50"], r["p99"], r["p999"],
                    "  %d non-2xx" % r["non_2xx"] if r["non_2xx"] else ""), flush=True)
                if cid == "a" and r["rps"] < 0.9 * rate:
                    saturated = True
            if saturated:
                print("  plain Envoy achieved under 90 %% of %d req/s: the ladder stops here" % rate)
                break
        load_after = os.getloadavg()
        for env in envs.values():
            env.check_upstream_reused()
        plain = {r["rate"]: r for r in results["a"]}
        print("\n| case | req/s | p50 ms | p99 ms | p99.9 ms | added p50 / p99 over (a) ms |")
        print("|---|---:|---:|---:|---:|---:|")
        for cid, rows in results.items():
            for r in rows:
                a = plain.get(r["rate"])
                added = "" if cid == "a" or a is None else "%+.2f / %+.2f" % (r["p50"] - a["p50"], r["p99"] - a["p99"])
                print("| (%s) | %d | %.2f | %.2f | %.2f | %s |" % (cid, r["rate"], r["p50"], r["p99"], r["p999"], added))
        print("\nknee (the highest rate with p99 under %g ms):" % KNEE_P99_MS)
        for cid, rows in results.items():
            held = [r["rate"] for r in rows if r["p99"] < KNEE_P99_MS and r["rps"] >= 0.9 * r["rate"]]
            print("  (%s) %s" % (cid, "%d req/s" % max(held) if held else "none on this ladder"))
        print("load average after %.2f %.2f %.2f" % load_after)
        if plot(results, args.plot):
            print("plot: %s" % args.plot)
        if args.json:
            Path(args.json).write_text(json.dumps({"oha": version, "results": results, "load_before": load_before,
                                                   "load_after": load_after}, indent=1))
    finally:
        for p in reversed(procs):
            p.stop()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except stack.StackError as e:
        print("error: %s" % e, file=sys.stderr)
        sys.exit(1)
