"""deploy/prometheus/alerts.yml: valid for Prometheus (promtool check rules) and behaving as meant (promtool
test rules alerts_test.yml), every alert with a firing and a non-firing case."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "deploy" / "prometheus"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None and not os.environ.get("CI"),
    reason="promtool not installed (Debian's prometheus package; `bash deploy/dev.sh install` adds it)",
)


def _alerts() -> set[str]:
    groups = yaml.safe_load((RULES_DIR / "alerts.yml").read_text())["groups"]
    return {rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL, "promtool is required under CI"
    return subprocess.run([PROMTOOL, *args], cwd=RULES_DIR, capture_output=True, text=True, timeout=120, check=False)


@needs_promtool
def test_promtool_accepts_the_rules():
    result = _promtool("check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in result.stdout


@needs_promtool
def test_promtool_unit_tests_of_the_rules_pass():
    result = _promtool("test", "rules", "alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_firing_and_a_non_firing_case():
    # given every case of the rule tests, by alert
    tests = yaml.safe_load((RULES_DIR / "alerts_test.yml").read_text())["tests"]
    cases: dict[str, set[bool]] = defaultdict(set)
    for test in tests:
        for case in test.get("alert_rule_test", []):
            cases[case["alertname"]].add(bool(case.get("exp_alerts")))
    # then each alert of alerts.yml fires in one case and stays silent in another
    assert _alerts() == set(cases), _alerts() ^ set(cases)
    for alert, outcomes in cases.items():
        assert outcomes == {True, False}, alert


def test_seed_alerts_are_all_there():
    # seed 001 §9.3: backlog age (and an early warning), read error spikes, sweeps, dead letters, DB, replicas
    assert {
        "MemoryButlerBacklogAgeBreach",
        "MemoryButlerBacklogStalled",
        "MemoryButlerReadErrorRate",
        "MemoryButlerScheduleSkipped",
        "MemoryButlerSweepFailing",
        "MemoryButlerDeadLetters",
        "MemoryButlerDatabaseConnectionsSaturated",
        "MemoryButlerCandidateStatementSlow",
        "MemoryButlerReplicaLag",
    } <= _alerts()
