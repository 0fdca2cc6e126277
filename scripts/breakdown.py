#!/usr/bin/env python3
"""idem's own cost per request, broken down (part of `make bench`).

    python3 scripts/breakdown.py [--requests 2000] [--no-callgrind]

1. Host calls and bytes per request, and the core's native time per request, for the paths of
   the bench's cases (c), (d), (e), (f): `cargo run --example breakdown` (filter/examples/).
2. Instructions per request under callgrind (`valgrind --tool=callgrind`), which counts
   instructions, not seconds: repeatable on a noisy machine. Each case runs twice (N and 2N
   requests) and the difference is divided by N, so the setup (4096 buckets created) cancels out.
   The instructions are grouped by component: SHA-256, allocation, formatting (`format!`),
   JSON, base64, copies, hash maps, the in-memory host and harness (not idem's: Envoy does that
   part), and the rest of idem's core.

Native x86-64 instructions are a proxy for what V8 runs from the same Rust compiled to Wasm:
the ratios between components carry over, the absolute numbers do not.
"""

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
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
    """(total instructions, {function: self instructions}) of a run of `n` requests of `case`."""
    out = Path(outdir) / ("cg-%s-%d.out" % (case, n))
    subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=%s" % out, str(EXAMPLE), str(n), case],
                   cwd=REPO, check=True, capture_output=True)
    ann = subprocess.run(["callgrind_annotate", "--threshold=100", str(out)], capture_output=True, text=True,
                         check=True).stdout
    funcs = {}
    total = 0
    for line in ann.splitlines():
        m = re.match(r"^\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(.*)$", line)
        if not m:
            continue
        count = int(m.group(1).replace(",", ""))
        name = m.group(2)
        if "PROGRAM TOTALS" in name:
            total = count
        elif ":" in name:
            funcs[name] = funcs.get(name, 0) + count
    return total, funcs


def group_of(name):
    for label, rx in GROUPS:
        if rx.search(name):
            return label
    return "idem's core (the rest)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000, help="requests per callgrind run (default 2000)")
    ap.add_argument("--no-callgrind", action="store_true", help="only the host calls and the native time")
    args = ap.parse_args()
    build()
    subprocess.run([str(EXAMPLE), "20000"], cwd=REPO, check=True)
    if args.no_callgrind:
        return 0
    if not shutil.which("valgrind") or not shutil.which("callgrind_annotate"):
        print("error: valgrind not found (apt-get install -y valgrind), or pass --no-callgrind", file=sys.stderr)
        return 2
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
