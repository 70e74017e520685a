"""Small versions of the read-path benchmarks (the full-size runs are commands of their own, see BENCHMARKS.md):
they must run end to end on a fresh database and print every figure."""

from __future__ import annotations

import re
import sys

from tests.bench import bench_gather, bench_latency


def _figures(out: str, label: str) -> list[float]:
    line = next(line for line in out.splitlines() if line.startswith(label))
    return [float(x) for x in re.findall(r"\d+\.\d+", line[len(label):])]


def test_latency_and_gather_benchmarks_run_small(empty_database_url, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench_latency.py", "--facts", "600", "--rules", "120", "--tenants", "3",
                                      "--queries", "8", "--phases", "--database-url", empty_database_url])
    assert bench_latency.main() == 0
    out = capsys.readouterr().out
    for label in ("embedding, 1 thread", "query embedding, read", "memory_search (total)", "memory_recall (total)",
                  "memory_context (total)"):
        p50, p95 = _figures(out, label)[:2]
        assert 0 < p50 <= p95, (label, out)
    # a read takes longer than the embedding inside it
    assert _figures(out, "memory_context (total)")[0] > _figures(out, "query embedding, read")[0]
    # the phases of memory_context: each ends after it starts, the statement after the embedding, all within the call
    phases = {label: _figures(out.split("memory_context phases")[1], label)
              for label in ("query embedding", "recent episodes", "gather statement", "ranking and hits",
                            "context block", "total")}
    assert all(start <= end for start, end in phases.values()), phases
    assert phases["query embedding"][1] <= phases["gather statement"][0] + 0.1
    assert max(end for _, end in phases.values()) == phases["total"][1]

    monkeypatch.setattr(sys, "argv", ["bench_gather.py", "--database-url", empty_database_url, "--tenants", "3",
                                      "--queries", "2", "--repeat", "1"])
    assert bench_gather.main() == 0
    out = capsys.readouterr().out
    for label in ("hybrid (both halves)", "semantic half", "keyword half"):
        assert _figures(out, label)[0] > 0, (label, out)
