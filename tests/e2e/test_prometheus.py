"""Operating idem with Prometheus: the alert rules (examples/prometheus/) pass promtool's own unit
tests, and a real Prometheus scraping a real Envoy that runs the filter sees one labelled family.
On the native build (`IDEM_ARTIFACT=native`, part of `make test`'s native pass) Prometheus scrapes
with the shipped examples/prometheus/scrape-native.yml, whose relabel rule gives the families Envoy
prefixes for a dynamic module the `.wasm`'s names: the same assertions then hold.

promtool and prometheus come from Debian's `prometheus` package (scripts/setup.sh installs it);
a missing one is a failure saying how to get it, never a skip.
"""

import json
import re
import shutil
import subprocess
import time
import urllib.parse

import pytest
import yaml

import stack
from conftest import new_key
from idemtest import post, wait_for

RULES_DIR = stack.REPO / "examples" / "prometheus"
NATIVE = stack.ARTIFACT == "native"
# The scrape job users are given for the native build: its relabel rule is what this file tests.
NATIVE_JOB = yaml.safe_load((RULES_DIR / "scrape-native.yml").read_text())["scrape_configs"][0]

POLICY = """
[[route]]
name = "create-order"
match = { method = "POST", path = "/api/order/create" }
"""


def tool(name):
    path = shutil.which(name)
    if not path:
        pytest.fail("%s not found; run `make setup` (apt-get install -y prometheus)" % name, pytrace=False)
    return path


def test_alert_rules_check_and_pass_their_unit_tests():
    out = subprocess.run([tool("promtool"), "check", "rules", "idem-rules.yml"], cwd=RULES_DIR,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "SUCCESS: 7 rules found" in out.stdout, out.stdout + out.stderr
    out = subprocess.run([tool("promtool"), "test", "rules", "idem-rules.test.yml"], cwd=RULES_DIR,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


def test_a_broken_rule_fails_its_unit_test(tmp_path):
    """The rule tests can fail: with the 2x threshold raised to 5x, the retry-storm alert the test
    expects never fires, and promtool says so."""
    (tmp_path / "idem-rules.yml").write_text((RULES_DIR / "idem-rules.yml").read_text().replace(
        "> 2 * (idem:interceptions:rate5m offset 1d)", "> 5 * (idem:interceptions:rate5m offset 1d)"))
    shutil.copy(RULES_DIR / "idem-rules.test.yml", tmp_path)
    out = subprocess.run([tool("promtool"), "test", "rules", "idem-rules.test.yml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "IdemInterceptionsDoubled" in out.stdout + out.stderr, out.stdout + out.stderr


def as_scraped(text):
    """Envoy's Prometheus text with the metric names a scrape keeps: natively, each renamed by the
    shipped job's `metric_relabel_configs` rule (a fully anchored regex on `__name__`, as
    Prometheus applies it); on the `.wasm`, as Envoy wrote them."""
    if not NATIVE:
        return text
    [rule] = NATIVE_JOB["metric_relabel_configs"]
    assert rule["source_labels"] == ["__name__"] and rule["target_label"] == "__name__", rule
    pattern, replacement = re.compile(rule["regex"]), re.sub(r"\$(\d+)", r"\\\1", rule["replacement"])

    def rename(name):
        m = pattern.fullmatch(name)
        return m.expand(replacement) if m else name

    out = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            line = "# TYPE %s %s" % (rename(name), kind)
        elif line and not line.startswith("#"):
            name, sep, rest = re.match(r"([^{ ]+)([{ ])(.*)", line).groups()
            line = rename(name) + sep + rest
        out.append(line)
    return "\n".join(out) + "\n"


def test_envoy_output_passes_promtool_check_metrics(make_envoy):
    env = make_envoy(POLICY)
    post(env, "/api/order/create", new_key())
    raw = env.admin("/stats/prometheus").body.decode()
    text = as_scraped(raw)
    assert "idem_requests_total{" in text, raw[:500]
    # Natively Envoy's own name is the prefixed one; the rule is what renames it.
    assert ("envoy_dynamicmodulescustom_idem_requests_total{" in raw) == NATIVE, raw[:500]
    assert_promtool_has_only_help_text_to_say(text)


def assert_promtool_has_only_help_text_to_say(text):
    """Envoy writes no HELP lines for any metric, so "no help text" is all promtool may say of the
    idem families: no complaint about names (the per-route names of earlier versions lacked
    `_total`; the histograms were `_ms`)."""
    idem = "\n".join(l for l in text.splitlines() if l.startswith(("idem_", "# TYPE idem_"))) + "\n"
    out = subprocess.run([tool("promtool"), "check", "metrics"], input=idem, capture_output=True, text=True,
                         timeout=60)
    complaints = [l for l in (out.stdout + out.stderr).splitlines() if l.strip() and not l.endswith("no help text")]
    assert not complaints, out.stdout + out.stderr
    assert "idem_requests_total no help text" in out.stdout + out.stderr, out.stdout + out.stderr


@pytest.fixture
def prometheus(workdir):
    """Starts a real Prometheus on loopback; `start(scrape_port)` returns its HTTP port."""
    procs = []

    def start(scrape_port):
        port = stack.free_port()
        cfg = workdir / ("prometheus-%d.yml" % port)
        target = {"targets": ["127.0.0.1:%d" % scrape_port]}
        # Natively, the job users are given (its relabel rule), pointed at this Envoy.
        job = dict(NATIVE_JOB, static_configs=[target]) if NATIVE else {
            "job_name": "envoy", "metrics_path": "/stats/prometheus", "static_configs": [target]}
        cfg.write_text(json.dumps({"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                                   "rule_files": [str(RULES_DIR / "idem-rules.yml")], "scrape_configs": [job]}))
        argv = [tool("prometheus"), "--config.file=%s" % cfg, "--web.listen-address=127.0.0.1:%d" % port,
                "--storage.tsdb.path=%s" % (workdir / ("prom-data-%d" % port))]
        p = stack.Proc("prometheus", argv, workdir / ("prometheus-%d.log" % port))
        procs.append(p)
        ready = stack.wait_until(lambda: _get(port, "/-/ready") is not None, 30)
        assert ready, "prometheus did not start:\n%s" % p.log_tail(30)
        return port

    yield start
    for p in procs:
        p.stop()


def _get(port, path):
    try:
        r = stack.request(port, "GET", path, timeout=2)
    except OSError:
        return None
    return r if r.status == 200 else None


def test_prometheus_scrapes_the_labelled_family_from_envoy(make_envoy, prometheus):
    env = make_envoy(POLICY)
    key = new_key()
    for _ in range(3):
        post(env, "/api/order/create", key)
    port = prometheus(env.admin_port)
    query = urllib.parse.quote('idem_requests_total{route="create-order",outcome="replayed"}')
    results = []

    def scraped():
        r = _get(port, "/api/v1/query?query=" + query)
        results[:] = r.json()["data"]["result"] if r else []
        return bool(results) and float(results[0]["value"][1]) >= 2

    wait_for(scraped, 30, interval=0.5, what="Prometheus to scrape idem_requests_total from Envoy")
    labels = results[0]["metric"]
    assert labels["route"] == "create-order" and labels["outcome"] == "replayed", labels
    assert labels["__name__"] == "idem_requests_total", labels
    # The rules loaded, and the recording rule computes per route.
    rules = _get(port, "/api/v1/rules").json()["data"]["groups"]
    assert any(g["name"] == "idem" and len(g["rules"]) == 7 for g in rules), rules
    wait_for(lambda: (_get(port, "/api/v1/query?query=" + urllib.parse.quote("idem:interceptions:rate5m")) or
                      stack.Response(0, [], b"{}")).json().get("data", {}).get("result"), 30, interval=0.5,
             what="the recording rule idem:interceptions:rate5m to have a value")


def test_the_dashboard_is_generated_and_every_panel_queries(make_envoy, prometheus):
    """examples/prometheus/idem-dashboard.json is what scripts/grafana_dashboard.py writes from its
    one list of panels, and every panel's expression is valid PromQL for a real Prometheus."""
    gen = stack.REPO / "scripts" / "grafana_dashboard.py"
    out = subprocess.run([str(stack.REPO / ".venv" / "bin" / "python"), str(gen), "--check"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    board = json.loads((RULES_DIR / "idem-dashboard.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    assert len(exprs) >= 7
    env = make_envoy(POLICY)
    port = prometheus(env.admin_port)
    for expr in exprs:
        r = stack.request(port, "GET", "/api/v1/query?query=" + urllib.parse.quote(expr), timeout=5)
        body = r.json() or {}
        assert r.status == 200 and body.get("status") == "success", "%s: %s" % (expr, r.body[:300])


def test_held_duplicates_wait_time_is_a_histogram(make_envoy, upstream):
    """What a counter cannot show: how long held duplicates waited, `idem_wait_time{route}` (Envoy
    merges histograms on its stats flush, every 5 s by default)."""
    import threading
    policy = POLICY + '[route.key]\non_in_flight = "wait"\n'
    env = make_envoy(policy, concurrency=1)
    key = new_key("wait")
    first = threading.Thread(target=lambda: post(env, "/api/order/create", key, headers={"x-demo-delay-ms": "1000"}))
    first.start()
    # The duplicate arrives while the first is in flight (at the upstream for 1 s more).
    wait_for(lambda: upstream.calls(key) == 1, 10, what="the first to reach the upstream")
    second = post(env, "/api/order/create", key)
    first.join(10)
    assert second.header("idempotent-replayed") == "true", second
    count = []

    def merged():
        text = as_scraped(env.admin("/stats/prometheus").body.decode())
        count[:] = [l for l in text.splitlines() if l.startswith('idem_wait_time_count{route="create-order"}')]
        return bool(count) and not count[0].endswith(" 0")

    wait_for(merged, 15, interval=0.5, what="idem_wait_time to be flushed")
    assert count[0].endswith(" 1"), count
    text = as_scraped(env.admin("/stats/prometheus").body.decode())
    total = next(l for l in text.splitlines() if l.startswith('idem_wait_time_sum{route="create-order"}'))
    assert 100 <= float(total.rsplit(" ", 1)[1]) <= 5000, total
    # Named as Envoy names its own timings (`upstream_rq_time`, in ms): promtool has nothing to say
    # of the name (`idem_wait_ms` was "abbreviated units"; Envoy's histograms hold integers, so
    # fractional `_seconds` cannot be recorded).
    assert_promtool_has_only_help_text_to_say(text)
