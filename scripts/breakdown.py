#!/usr/bin/env python3
"""idem's own cost per request, broken down (part of `make bench`).

    python3 scripts/breakdown.py [--requests 2000] [--no-callgrind] [--envoy]

1. Host calls and bytes per request, and the core's native time per request, for the paths of
   the bench's cases (c), (d), (e), (f): `cargo run --example breakdown` (filter/examples/).
2. Instructions per request under callgrind (`valgrind --tool=callgrind`), which counts
   instructions, not seconds: repeatable on a noisy machine. Each case runs twice (N and 2N
   requests) and the difference is divided by N, so the setup (every bucket created) cancels out.
   The instructions are grouped by component: SHA-256, allocation, formatting (`format!`),
   JSON, base64, copies, hash maps, the in-memory host and harness (not idem's: Envoy does that
   part), and the rest of idem's core.

Native x86-64 instructions are a proxy for what V8 runs from the same Rust compiled to Wasm:
the ratios between components carry over, the absolute numbers do not.

3. With `--envoy`: instructions per request *inside a real Envoy* under callgrind, for (a) plain
   Envoy, (b) the filter on a route without a policy, (c0) the floor module, (c0s) the floor
   plus a fresh key's shared-data calls, (c0sh) also with the scoped id's SHA-256 and the body's
   xxh3 (bench/floor's `store sha256 xxh3` mode: no logic of idem's), and (c)/(d) idem,
   with the built `.wasm` (V8 compiles it as usual; callgrind sees the JIT code). Counters are
   zeroed after a warm-up and dumped after `--envoy-requests` sequential requests, so the number
   is the whole process' work per request: Envoy, V8, the host calls and the module. Unlike CPU
   time on a shared machine it does not move with other load, so it tells a change of a few
   per cent apart. Split into the module's code (V8's JIT code) and the rest (Envoy and V8's
   builtins: the host calls, the crossings, the buffers).
   The Redis path too, a fresh key each request against the same Redis and Webdis: (e0) the
   floor making a fresh key's two Webdis calls, (e) the `.wasm`, (e-native) the native build
   through Webdis, (e-direct) the native build speaking RESP to Redis itself.
"""

import argparse
import base64
import glob
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "target" / "release" / "examples" / "breakdown"
CASES = ["c", "d", "e", "f"]
GROUPS = [
    ("SHA-256", re.compile(r"sha2::")),
    ("allocation", re.compile(r"malloc\.c|alloc::raw_vec|alloc::alloc|__rust_(alloc|dealloc|realloc)|cfree|_int_")),
    ("formatting", re.compile(r"core::fmt|alloc::fmt|pad_integral|<u8 as core::fmt|Write>::write_str")),
    ("JSON", re.compile(r"serde_json|serde::")),
    ("base64", re.compile(r"base64::")),
    ("copies (memcpy, memcmp)", re.compile(r"memmove|memcpy|memcmp|memset|Clone>::clone")),
    ("hash maps (std SipHash, hashbrown; the in-memory host's and idem's)", re.compile(r"hashbrown|core::hash::")),
    ("in-memory host + harness (not idem's)", re.compile(r"idem_filter::testing::|breakdown::|std::sync|Mutex")),
]


def build():
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "idem-filter", "--features", "fake-host",
                    "--example", "breakdown"], cwd=REPO, check=True)


def callgrind(case, n, outdir):
    """(total instructions, {"file:function": self instructions}) of a run of `n` requests of `case`."""
    out = Path(outdir) / ("cg-%s-%d.out" % (case, n))
    subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=%s" % out, str(EXAMPLE), str(n), case],
                   cwd=REPO, check=True, capture_output=True)
    funcs = {}
    for (_, name), count in self_costs(out).items():
        funcs[name] = funcs.get(name, 0) + count
    return sum(funcs.values()), funcs


def envoy_binary():
    """The Envoy executable itself (valgrind follows pip's launcher script no further than its `exec`)."""
    sys.path.insert(0, str(REPO / "scripts"))
    import stack
    return str(stack.envoy_executable())


def records(path):
    """A callgrind output file as records, with names resolved from callgrind's name compression
    (objects, files and functions are numbered apart): `("self", obj, "file:function", cost)` for
    a function's own instructions, `("call", obj, "file:function", callee, calls, inclusive)` for
    its calls to `callee` (a function name) and what they cost, callees included."""
    tables = {"ob": {}, "fl": {}, "fn": {}}
    space = {"ob": "ob", "cob": "ob", "fl": "fl", "fi": "fl", "fe": "fl", "cfi": "fl", "cfl": "fl",
             "fn": "fn", "cfn": "fn"}
    obj = fn_obj = fn = callee = "?"
    file = fn_file = "???"
    call = None
    for line in open(path):
        key, eq, val = line.rstrip("\n").partition("=")
        if eq and key in space:
            table = tables[space[key]]
            m = re.match(r"\((\d+)\)(?: (.*))?$", val)
            if m:
                if m.group(2):
                    table[m.group(1)] = m.group(2)
                val = table.get(m.group(1), val)
            if key == "ob":
                obj = val
            elif key == "fl":
                file = fn_file = val
            elif key in ("fi", "fe"):
                fn_file = val
            elif key == "fn":
                fn, fn_obj, fn_file = val, obj, file
            elif key == "cfn":
                callee = val
        elif line.startswith("calls="):
            call = int(line[6:].split()[0])
        elif line[:1].isdigit() or line[:1] in "+-*":
            parts = line.split()
            calls, call = call, None
            if len(parts) < 2:
                continue
            if calls is not None:
                yield ("call", fn_obj, "%s:%s" % (fn_file, fn), callee, calls, int(parts[1]))
            else:
                yield ("self", fn_obj, "%s:%s" % (fn_file, fn), int(parts[1]))


def self_costs(path):
    """{(object, "file:function"): self instructions} from a callgrind output file."""
    costs = {}
    for r in records(path):
        if r[0] == "self":
            costs[(r[1], r[2])] = costs.get((r[1], r[2]), 0) + r[3]
    return costs


def calls_out(path, modules):
    """What a native module's calls into Envoy cost, callees included: {kind: (instructions,
    calls)} for Envoy's counter increments, the allocator (malloc and free: Envoy's tcmalloc
    serves the module's Rust allocations), and its other callbacks."""
    out = {}
    for r in records(path):
        if r[0] != "call" or not r[1].endswith(modules):
            continue
        callee = r[3]
        if "increment_counter" in callee:
            kind = "counter increments"
        elif callee in ("malloc", "free", "realloc", "calloc", "posix_memalign", "aligned_alloc"):
            kind = "malloc/free"
        elif callee.startswith("envoy_dynamic_module_callback"):
            kind = "other callbacks"
        else:
            continue
        cost, calls = out.get(kind, (0, 0))
        out[kind] = (cost + r[5], calls + r[4])
    return out


def is_jit(obj, name):
    """V8's JIT code: no object file, at an address above the binaries' (the module's code)."""
    m = re.search(r"0x([0-9a-f]+)", name)
    return obj == "???" and m is not None and int(m.group(1), 16) > 1 << 32


def order_of(size):
    """The bench's JSON order padded to `size` bytes, as scripts/wrk/unique_keys.lua pads it."""
    head, tail = '{"sku":"A1","qty":1,"note":"', '"}'
    pad = size - len(head) - len(tail)
    return '{"sku":"A1","qty":1}' if pad <= 0 else head + "x" * pad + tail


# The Redis cases (a fresh key each request, as the bench's (e) family): which Envoy module, and the
# policy's kind. (e0) is bench/floor's `callouts` mode: a no-op filter making the same two Webdis
# calls a fresh key costs (claim, completion) with no logic of idem's.
REDIS_CASES = {"e0": "floor", "e": "wasm", "e-native": "native", "e-direct": "direct"}


def envoy_case(case, n, tmp, store=None):
    """(instructions per request, of which the module's JIT code, and for a native case what its
    calls into Envoy cost per request as `calls_out` sorts them, else None) for `case` in a real Envoy.
    `a-16k`, `c0-16k` and `c16k` are (a), (c0) and (c) with 16 KB orders; `c-native`, `d-native` and
    `c16k-native` are (c), (d) and (c16k) on idem's native build (target/native/libidem_native.so).
    The Redis cases (REDIS_CASES) need `store`, the (Redis, Webdis) they talk to."""
    named = case
    redis_kind = REDIS_CASES.get(case)
    native = (case.endswith("-native") and case != "c0-native") or redis_kind in ("native", "direct")
    case = case.removesuffix("-native") if native and not redis_kind else case
    body = order_of(16384) if case.endswith("16k") else order_of(0)
    case = {"c16k": "c"}.get(case, case.removesuffix("-16k"))
    import stack
    from bench import FLOOR_WASM, NATIVE_FLOOR, SCENARIO, native_floor_config
    from stack.envoy_config import idem_config
    from stack.http import free_port

    policy = (REPO / "bench" / "scenario" / "shared.toml").read_text()
    extra_clusters = []
    if redis_kind:
        redis, webdis = store
        # A generous timeout: Envoy under valgrind runs some fifty times slower than on the hardware.
        direct = redis.port if redis_kind == "direct" else None
        policy = stack.redis_table(timeout="5s", prefix="idem-cg-%s:" % case, direct_port=direct) + "\n" + (
            SCENARIO / "redis-route.toml").read_text()
        extra_clusters = [stack.webdis_cluster(webdis.port)]
    routes = [
        {"name": "bench-key", "match": {"path": "/api/order/create"}, "idem": True},
        {"name": "bench-nopolicy", "match": {"path": "/api/no-policy"}, "idem": True},
    ]
    module = {"a": None, "b": stack.require_wasm(), "c0": FLOOR_WASM, "c0-native": NATIVE_FLOOR,
              "c0s": FLOOR_WASM, "c0sh": FLOOR_WASM, "c": stack.require_wasm(), "d": stack.require_wasm(),
              "e0": FLOOR_WASM, "e": stack.require_wasm()}.get(case)
    # The floor's configuration (bench/floor): (c0s) adds a fresh key's shared-data calls, (c0sh)
    # the scoped id's SHA-256 and the body's xxh3 too; (e0) the two Webdis calls.
    floor_mode = {"c0": "", "c0s": "store", "c0sh": "store sha256 xxh3"}
    if case == "e0":
        floor_mode["e0"] = "callouts webdis %s" % base64.b64encode(stack.WEBDIS_AUTH.encode()).decode()
    if native:
        module = stack.NATIVE
    if module is not None and not Path(module).is_file():
        raise SystemExit("error: (%s) needs %s; see scripts/bench.py" % (case, module))
    fast = stack.start_fast_upstream(tmp)
    listen, admin = free_port(), free_port()
    env = None
    if case == "c0-native":
        # (c0)'s no-op as a native dynamic module (bench/floor-native): no VM, its code is the .so's.
        cfg = native_floor_config(listen, admin, fast.listen_port, routes)
        env = dict(os.environ, ENVOY_DYNAMIC_MODULES_SEARCH_PATH=str(NATIVE_FLOOR.parent))
    else:
        cfg = idem_config(listen_port=listen, admin_port=admin, upstream_port=fast.listen_port,
                          policy_toml=floor_mode.get(case, policy), routes=routes,
                          wasm_path=str(module) if module else None, with_filter=module is not None,
                          extra_clusters=extra_clusters)
        if native:
            env = dict(os.environ, ENVOY_DYNAMIC_MODULES_SEARCH_PATH=str(stack.NATIVE.parent))
    cfg_path = Path(tmp) / ("envoy-%s.json" % named)
    cfg_path.write_text(json.dumps(cfg))
    out = Path(tmp) / ("envoy-%s.cg" % named)
    log = open(Path(tmp) / ("envoy-%s.log" % named), "w")
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", "--smc-check=all-non-file", "--callgrind-out-file=%s" % out,
                             envoy_binary(), "-c", str(cfg_path), "--disable-hot-restart", "--concurrency", "1",
                             "-l", "warning"], stdout=log, stderr=subprocess.STDOUT, env=env)
    path = "/api/no-policy" if case == "b" else "/api/order/create"
    try:
        conn = None
        for _ in range(600):
            if proc.poll() is not None:
                raise SystemExit("error: Envoy under valgrind exited; see %s" % log.name)
            try:
                conn = http.client.HTTPConnection("127.0.0.1", listen, timeout=60)
                conn.request("GET", "/api/ready")
                conn.getresponse().read()
                break
            except OSError:
                conn = None
                time.sleep(0.5)
        if conn is None:
            raise SystemExit("error: Envoy under valgrind did not come up; see %s" % log.name)
        statuses = {}

        def send(i, prefix):
            # As the bench's wrk scripts: (d) repeats one key, the others use a fresh one.
            key = "bench-replay" if case == "d" else "%s-%d" % (prefix, i)
            conn.request("POST", path, body=body, headers={
                "Idempotency-Key": key, "Content-Type": "application/json", "Authorization": "Bearer bench"})
            r = conn.getresponse()
            r.read()
            return r.status

        for i in range(200):
            send(i, "warm")
        webdis_before = admin_counter(admin, "cluster.webdis.upstream_rq_total") if redis_kind else 0
        subprocess.run(["callgrind_control", "-z", str(proc.pid)], check=True, capture_output=True)
        for i in range(n):
            status = send(i, "k")
            statuses[status] = statuses.get(status, 0) + 1
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
        expected = 200
        if statuses != {expected: n}:
            raise SystemExit("error: (%s) answered %s, expected %d %s" % (named, statuses, n, expected))
        # One upstream connection serves these sequential requests: a connect per request would be
        # counted as the case's cost (bench.py checks the same).
        try:
            stack.check_upstream_reuse("(%s)" % named, "demo_upstream",
                                       admin_counter(admin, "cluster.demo_upstream.upstream_cx_total"),
                                       admin_counter(admin, "cluster.demo_upstream.upstream_rq_total"))
        except stack.StackError as e:
            raise SystemExit("error: %s" % e)
        if redis_kind:
            check_redis_case(named, redis_kind, admin, n, webdis_before)
        if floor_mode.get(case) and not redis_kind:
            # The floor's store mode counts each claim and completion it made: it did the work.
            stats = http.client.HTTPConnection("127.0.0.1", admin, timeout=60)
            stats.request("GET", "/stats?filter=floor_")
            text = stats.getresponse().read().decode()
            counts = dict(re.findall(r"(floor_\w+): (\d+)", text))
            if counts.get("floor_requests") != str(n + 200) or counts.get("floor_stored") != str(n + 200):
                raise SystemExit("error: (%s) the floor counted %s, expected %d claims and completions"
                                 % (case, counts, n + 200))
    finally:
        proc.terminate()
        proc.wait(120)
        fast.stop()
    dumps = sorted(glob.glob(str(out) + ".*"))
    if not dumps:
        raise SystemExit("error: callgrind wrote no dump for (%s)" % case)
    costs = self_costs(dumps[-1])
    total = sum(costs.values())
    # The native module's own threads (the direct Redis client's) are counted with the process.
    modules = ("/" + NATIVE_FLOOR.name, "/" + stack.NATIVE.name)
    jit = sum(v for (obj, fn), v in costs.items() if is_jit(obj, fn) or obj.endswith(modules))
    spent = None
    if native or case == "c0-native":
        spent = {kind: (cost / n, calls / n) for kind, (cost, calls) in calls_out(dumps[-1], modules).items()}
    return total / n, jit / n, spent


def admin_counter(admin, name):
    """One of Envoy's counters, by its full name, from the admin listener (0 when absent)."""
    conn = http.client.HTTPConnection("127.0.0.1", admin, timeout=60)
    conn.request("GET", "/stats?filter=" + re.escape(name).replace("\\", "%5C"))
    for line in conn.getresponse().read().decode(errors="replace").splitlines():
        stat, _, value = line.partition(": ")
        if stat.strip() == name:
            return int(value)
    return 0


def check_redis_case(case, kind, admin, n, webdis_before):
    """A Redis case measured what it says: idem counted every request forwarded on its Redis route
    (the floor counts nothing), and each request made its two Webdis calls (claim, completion) —
    none when the native build speaks RESP itself. Prints what it found."""
    webdis = admin_counter(admin, "cluster.webdis.upstream_rq_total") - webdis_before
    want_webdis = 0 if kind == "direct" else 2 * n
    if webdis != want_webdis:
        raise SystemExit("error: (%s) made %d Webdis calls for %d requests, expected %d" % (case, webdis, n, want_webdis))
    if kind != "floor":
        conn = http.client.HTTPConnection("127.0.0.1", admin, timeout=60)
        conn.request("GET", "/stats?filter=idem_requests_total")
        text = conn.getresponse().read().decode(errors="replace")
        forwarded = sum(int(v) for name, v in re.findall(r"^(\S+): (\d+)$", text, re.M)
                        if "bench-redis" in name and "forwarded" in name)
        if forwarded != n + 200:
            raise SystemExit("error: (%s) idem counted %d requests forwarded on bench-redis, expected %d"
                             % (case, forwarded, n + 200))
    print("(%s): %.2f Webdis calls per request" % (case, webdis / n))


def report_envoy(n, cases, keep=None):
    print("\ninstructions per request inside Envoy under callgrind (%d sequential requests after 200 warm-up "
          "ones; the whole process: Envoy, V8, host calls, the module):" % n)
    results = {}
    with tempfile.TemporaryDirectory(prefix="idem-envoy-cg-") as tmp:
        store = None
        if any(c in REDIS_CASES for c in cases):
            import stack
            redis = stack.Redis(tmp)
            store = (redis, stack.Webdis(tmp, redis.port))
        try:
            for case in cases:
                total, jit, spent = envoy_case_kept(case, n, tmp, store, keep)
                results[case] = total
                over = ", %+.0f over (a)" % (total - results["a"]) if case != "a" and "a" in results else ""
                print("(%s)%s %8.0f instructions/req (the module's code %.0f, Envoy + V8 + host calls %.0f)%s"
                      % (case, " " * (3 - len(case)), total, jit, total - jit, over))
                if spent:
                    print("    of Envoy's, the module's calls into it, callees included: " + ", ".join(
                        "%s %.0f (%.1f calls)" % (kind, cost, calls) for kind, (cost, calls) in sorted(spent.items())))
        finally:
            if store:
                store[1].stop()
                store[0].stop()
    return compare_envoy(results)


def envoy_case_kept(case, n, tmp, store, keep):
    """envoy_case, its callgrind dump copied into `keep` (for `callgrind_annotate --inclusive=yes`)."""
    total, jit, spent = envoy_case(case, n, tmp, store)
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for dump in glob.glob(str(Path(tmp) / ("envoy-%s.cg.*" % case))):
            shutil.copy(dump, keep)
    return total, jit, spent


def compare_envoy(results):
    """Each case against its floor, as far as both were counted."""
    for c, c0 in [("c", "c0"), ("c16k", "c0-16k"), ("c0sh", "c0"), ("c0sh-16k", "c0-16k"), ("c", "c0sh"),
                  ("c16k", "c0sh-16k"), ("c-native", "a"), ("c16k-native", "a-16k"), ("d-native", "a"),
                  ("c-native", "c0-native"), ("c-native", "c"), ("e", "e0"), ("e-native", "e0"),
                  ("e-native", "e"), ("e-direct", "e0"), ("e-direct", "e"), ("e-native", "a"), ("e", "a")]:
        if c in results and c0 in results:
            ours, floor = results[c], results[c0]
            print("(%s) against its floor (%s): %+.1f %% (%+.0f instructions/req)"
                  % (c, c0, 100.0 * (ours - floor) / floor, ours - floor))
    return results


def group_of(name):
    for label, rx in GROUPS:
        if rx.search(name):
            return label
    return "idem's core (the rest)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000, help="requests per callgrind run (default 2000)")
    ap.add_argument("--no-callgrind", action="store_true", help="only the host calls and the native time")
    ap.add_argument("--envoy", action="store_true", help="also count instructions per request in a real Envoy")
    ap.add_argument("--envoy-keep", metavar="DIR", help="copy each Envoy case's callgrind dump into DIR")
    ap.add_argument("--envoy-requests", type=int, default=300, help="requests per Envoy case (default 300)")
    ap.add_argument("--envoy-cases", default="a,b,c0,c0s,c0sh,c,d,c0-16k,c0sh-16k,c16k",
                    help="the Envoy cases to count (default a,b,c0,c0s,c0sh,c,d,c0-16k,c0sh-16k,c16k; also "
                         "c0-native, the floor as a native dynamic module, once bench/floor-native is built; "
                         "c-native, d-native, c16k-native: idem's native build, target/native; the Redis "
                         "path, a fresh key each request: e0 (the floor's two Webdis calls), e (the .wasm), "
                         "e-native (through Webdis), e-direct (RESP to Redis itself)). "
                         "(c0s) is the floor plus a fresh key's shared-data calls, clock and counters; (c0sh) "
                         "also hashes the scoped id (SHA-256) and the body (xxh3): what any shared-data "
                         "idempotency filter with those digests costs before its own logic")
    args = ap.parse_args()
    build()
    subprocess.run([str(EXAMPLE), "20000"], cwd=REPO, check=True)
    if args.no_callgrind:
        return 0
    if not shutil.which("valgrind"):
        print("error: valgrind not found (apt-get install -y valgrind), or pass --no-callgrind", file=sys.stderr)
        return 2
    if args.envoy:
        report_envoy(args.envoy_requests, args.envoy_cases.split(","), args.envoy_keep)
    n = args.requests
    print("\ninstructions per request under callgrind (native x86-64, (run of %d - run of %d) / %d):" % (2 * n, n, n))
    with tempfile.TemporaryDirectory(prefix="idem-breakdown-") as tmp:
        for case in CASES:
            t1, f1 = callgrind(case, n, tmp)
            t2, f2 = callgrind(case, 2 * n, tmp)
            per_req = (t2 - t1) / n
            groups = {}
            for name in set(f1) | set(f2):
                groups[group_of(name)] = groups.get(group_of(name), 0) + (f2.get(name, 0) - f1.get(name, 0)) / n
            parts = sorted(groups.items(), key=lambda kv: -kv[1])
            print("(%s) %7.0f instructions/req: %s" % (case, per_req, ", ".join(
                "%s %.0f (%.0f %%)" % (k, v, 100.0 * v / per_req) for k, v in parts if v > 0.005 * per_req)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
