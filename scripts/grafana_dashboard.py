#!/usr/bin/env python3
"""Writes examples/prometheus/idem-dashboard.json, a Grafana dashboard for idem's metrics, from one
list of panels (PANELS). `--check` exits 1 when the committed file differs from what this writes.

    python3 scripts/grafana_dashboard.py [--check]

Every expression is queried against a real Prometheus in tests/e2e/test_prometheus.py.
"""

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "examples" / "prometheus" / "idem-dashboard.json"

# (title, PromQL expression, legend, unit)
PANELS = [
    ("Interceptions per route (duplicates answered by the gateway)", "idem:interceptions:rate5m", "{{route}}", "reqps"),
    ("Decisions per outcome", "sum by (outcome) (rate(idem_requests_total[5m]))", "{{outcome}}", "reqps"),
    ("First executions per route", 'sum by (route) (rate(idem_requests_total{outcome="forwarded"}[5m]))',
     "{{route}}", "reqps"),
    ("Store errors and dropped writes", 'sum by (route) (rate(idem_requests_total{outcome=~"store_error|write_dropped"}[5m]))',
     "{{route}}", "reqps"),
    ("Unknown outcomes to reconcile (last hour)", 'sum by (route) (increase(idem_requests_total{outcome="held"}[1h]))',
     "{{route}}", "short"),
    ("Lease takeovers (last hour)", 'sum by (route) (increase(idem_requests_total{outcome="lease_lost"}[1h]))',
     "{{route}}", "short"),
    ("Requests on filter routes without a policy", "sum by (outcome) (rate(idem_unmatched_total[5m]))",
     "{{outcome}}", "reqps"),
]


def dashboard():
    panels = []
    for i, (title, expr, legend, unit) in enumerate(PANELS):
        panels.append({
            "id": i + 1,
            "type": "timeseries",
            "title": title,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": (i % 2) * 12, "y": (i // 2) * 8},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": "A", "expr": expr, "legendFormat": legend}],
        })
    return {
        "title": "idem: idempotency at the gateway",
        "uid": "idem-gateway",
        "schemaVersion": 38,
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]},
        "panels": panels,
    }


def render():
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main(argv):
    if "--check" in argv:
        if not OUT.is_file() or OUT.read_text() != render():
            print("%s is not what scripts/grafana_dashboard.py writes; run it to regenerate" % OUT, file=sys.stderr)
            return 1
        return 0
    OUT.write_text(render())
    print("wrote %s (%d panels)" % (OUT, len(PANELS)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
