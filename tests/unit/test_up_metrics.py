"""`memory-butler up` says where the metrics are, and starts its worker with a metrics port."""

from __future__ import annotations

from pathlib import Path

from memory_api.cli.stack import UP_WORKER_METRICS_PORT, plan_parts, print_summary
from shared.config import load_settings


def test_up_serves_worker_metrics_and_prints_where_metrics_are(tmp_path: Path, capsys):
    # given the parts `up` would start
    settings = load_settings(data_dir=tmp_path)
    parts = plan_parts(settings, host="127.0.0.1", port=8150, flower_port=5555)
    # then the worker is started with a metrics port on 127.0.0.1, checked free like the others
    worker = parts["worker"]
    assert worker["env"]["MEMORY_BUTLER_WORKERS__METRICS_PORT"] == str(UP_WORKER_METRICS_PORT)
    assert worker["env"]["MEMORY_BUTLER_WORKERS__METRICS_HOST"] == "127.0.0.1"
    assert worker["port"] == ("127.0.0.1", UP_WORKER_METRICS_PORT)
    # when the summary is printed
    token = tmp_path / "dev-token"
    token.write_text("mb_dev\n")
    record = {
        "database_url": "postgresql://u:secret@127.0.0.1:5432/db",
        "redis_url": "redis://127.0.0.1:6379/0",
        "postgres": {"embedded": True, "pgdata": str(tmp_path / "pgdata")},
        "redis": {"origin": "running"},
        "parts": {
            n: {k: v for k, v in p.items() if k in ("url", "note", "skipped", "metrics")} for n, p in parts.items()
        },
        "token_file": str(token),
        "log_dir": str(tmp_path / "logs"),
    }
    print_summary(record)
    out = capsys.readouterr().out
    # then it names the front's /metrics and the worker node's
    assert "Metrics        http://127.0.0.1:8150/metrics" in out
    assert f"Worker metrics http://127.0.0.1:{UP_WORKER_METRICS_PORT}/metrics" in out


def test_a_configured_worker_metrics_port_is_used(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path, workers={"metrics_port": 9333})
    parts = plan_parts(settings, host="127.0.0.1", port=8150, flower_port=5555)
    assert parts["worker"]["metrics"] == "http://127.0.0.1:9333/metrics"
