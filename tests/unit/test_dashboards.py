"""deploy/grafana's dashboard and deploy/prometheus' rules use only metric names Memory Butler exposes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client.registry import REGISTRY

from shared import telemetry

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "memory-butler.json"
# Produced by the read-replica work of issue 17 (§3), not by shared/telemetry.py.
EXTERNAL = {"memory_butler_replica_lag_seconds"}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
NAME = re.compile(r"\b(memory_butler_[a-z0-9_]+)")


def exposed() -> set[str]:
    """Every sample name /metrics or a worker node can show: the process metrics and the scrape-time gauges."""
    row = {field: 0 for _, _, series in telemetry.KEY_GAUGES for field, _ in series} | {"tenant_id": "t", "butler": "b"}
    families = [
        *telemetry.key_families([row]),
        *telemetry.maintenance_families(
            {"t": {"started_at": 1.0, "finished_at": 1.0, "succeeded_at": 1.0}}, {"t": 60.0}
        ),
        *telemetry.fleet_families(queue_depths={"q": 0}, db={"connections": 1, "max_connections": 2}),
        *telemetry.front_families(database_up=True, pool_checked_out=0),
    ]
    names = {f.name for f in families}
    for family in REGISTRY.collect():
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
    return names


def _exprs(panel: dict) -> list[str]:
    return [t["expr"] for t in panel.get("targets", [])]


def test_the_dashboard_parses_and_every_panel_queries_prometheus():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 20
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert _exprs(panel), panel["title"]


def test_the_dashboard_covers_the_slos_and_the_lifecycle():
    titles = " | ".join(p["title"] for p in json.loads(DASHBOARD.read_text())["panels"])
    for words in (
        "memory_context p95",
        "memory_search p95",
        "write success",
        "backlog p95 age",
        "Dead letters",
        "Queue depth",
        "reads returning nothing",
        "diversity",
        "Confidence",
        "Replica lag",
    ):
        assert words in titles, words


def test_the_dashboard_references_only_metrics_that_exist():
    known = exposed() | EXTERNAL
    used = {name for p in json.loads(DASHBOARD.read_text())["panels"] for e in _exprs(p) for name in NAME.findall(e)}
    assert used and used <= known, used - known


def test_the_alert_rules_reference_only_metrics_that_exist():
    known = exposed() | EXTERNAL
    groups = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())["groups"]
    used = {name for g in groups for rule in g["rules"] for name in NAME.findall(rule["expr"])}
    assert used and used <= known, used - known
