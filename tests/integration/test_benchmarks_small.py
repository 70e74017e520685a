"""Small versions of the benchmarks (the full-size runs are commands of their own, see BENCHMARKS.md): each
must run end to end on a fresh database, print every figure, and leave its Redis database empty.

The read-path benchmarks run in this process; the worker-plane and MCP ones as the commands users run, since
they start celery workers or the front as subprocesses and configure the Celery app."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import redis as redis_lib
from sqlalchemy import create_engine, text

from tests.bench import bench_gather, bench_latency
from tests.bench.extraction_dataset import CASES
from tests.conftest import ROOT

# The small runs' own Redis database (the suite's is TEST_REDIS_DB, the full-size benchmarks' is 15).
SMALL_BENCH_REDIS_URL = os.environ.get("TEST_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")


def _figures(out: str, label: str, number: str = r"\d+\.\d+") -> list[float]:
    """The numbers on the printed line that starts with ``label`` (by default those with a decimal point)."""
    line = next(line for line in out.splitlines() if line.startswith(label))
    return [float(x) for x in re.findall(number, line[len(label) :])]


def test_latency_and_gather_benchmarks_run_small(empty_database_url, capsys, monkeypatch):
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "bench_latency.py",
            "--facts",
            "600",
            "--rules",
            "120",
            "--tenants",
            "3",
            "--queries",
            "8",
            "--phases",
            "--database-url",
            empty_database_url,
        ],
    )
    assert bench_latency.main() == 0
    out = capsys.readouterr().out
    for label in (
        "embedding, 1 thread",
        "query embedding, read",
        "memory_search (total)",
        "memory_recall (total)",
        "memory_context (total)",
    ):
        p50, p95 = _figures(out, label)[:2]
        assert 0 < p50 <= p95, (label, out)
    # a read takes longer than the embedding inside it
    assert _figures(out, "memory_context (total)")[0] > _figures(out, "query embedding, read")[0]
    # the phases of memory_context: each ends after it starts, the statement after the embedding, all within the call
    phases = {
        label: _figures(out.split("memory_context phases")[1], label)
        for label in ("query embedding", "gather statement", "ranking", "context block", "total")
    }
    assert all(start <= end for start, end in phases.values()), phases
    assert phases["query embedding"][1] <= phases["gather statement"][0] + 0.1
    assert max(end for _, end in phases.values()) == phases["total"][1]

    monkeypatch.setattr(
        sys,
        "argv",
        ["bench_gather.py", "--database-url", empty_database_url, "--tenants", "3", "--queries", "2", "--repeat", "1"],
    )
    assert bench_gather.main() == 0
    out = capsys.readouterr().out
    for label in ("hybrid (both halves)", "semantic half", "keyword half", "text rows", "binary rows"):
        assert _figures(out, label)[0] > 0, (label, out)


def _run(script: str, *args: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, f"tests/bench/{script}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def _redis_left_empty() -> bool:
    client = redis_lib.Redis.from_url(SMALL_BENCH_REDIS_URL)
    try:
        return client.dbsize() == 0
    finally:
        client.close()


def test_drain_benchmark_runs_small(empty_database_url):
    out = _run(
        "bench_drain.py",
        "--episodes",
        "120",
        "--workers",
        "1",
        "--tenants",
        "2",
        "--butlers",
        "2",
        "--database-url",
        empty_database_url,
        "--redis-url",
        SMALL_BENCH_REDIS_URL,
    )
    raw = float(re.search(r"batches of 256\): (\d+) episodes/s", out)[1])
    drain = re.search(
        r"drain: 120 episodes applied with embeddings in ([\d.]+)s by 1 worker\(s\) "
        r"= (\d+) episodes/s",
        out,
    )
    end_to_end = re.search(r"(\d+) episodes/s end to end; (\d+) facts, (\d+) rules", out)
    assert raw > 0 and drain and float(drain[2]) > 0 and end_to_end, out
    assert int(end_to_end[2]) > 0, out  # the heuristic extractor turned some episodes into facts
    assert _redis_left_empty()
    # conversation turns: each after the first of its session also gets its contextual vector
    out = _run(
        "bench_drain.py",
        "--texts",
        "realmem",
        "--episodes",
        "40",
        "--workers",
        "1",
        "--tenants",
        "2",
        "--database-url",
        empty_database_url,
        "--redis-url",
        SMALL_BENCH_REDIS_URL,
    )
    assert re.search(r"drain: 40 episodes applied with embeddings in [\d.]+s by 1 worker\(s\)", out), out
    engine = create_engine(empty_database_url)
    try:
        with engine.connect() as conn:
            turns, in_session, vectors = conn.execute(
                text(
                    "SELECT count(*), count(session_id), (SELECT count(DISTINCT episode_id) FROM episode_vectors "
                    "WHERE butler = 'assistant') FROM episodes WHERE butler = 'assistant'"
                )
            ).one()
    finally:
        engine.dispose()
    assert turns == in_session == 40 and vectors >= 30, (turns, in_session, vectors)
    assert _redis_left_empty()


def test_mcp_benchmark_runs_small(empty_database_url):
    out = _run(
        "bench_mcp.py",
        "--facts",
        "300",
        "--rules",
        "60",
        "--tenants",
        "2",
        "--clients",
        "2",
        "--seconds",
        "1",
        "--accepts",
        "10",
        "--database-url",
        empty_database_url,
        "--redis-url",
        SMALL_BENCH_REDIS_URL,
    )
    p50, p95, p99 = _figures(out, "raw candidate SQL")
    assert 0 < p50 <= p95 <= p99, out
    for label in ("raw accept CPU, first try", "raw accept CPU, key look-up"):
        p50, p95 = _figures(out, label)
        assert 0 < p50 <= p95, (label, out)
    for label in (
        "memory_context via MCP",
        "memory_search via MCP",
        "memory_store_episode accept via MCP",
        "memory_ingest_batch(50) call via MCP",
    ):
        p50, p95, p99, rate = _figures(out, label, number=r"\d+(?:\.\d+)?")  # the rate has no decimals
        assert 0 < p50 <= p95 <= p99 and rate > 0, (label, out)

    def per_call(line: str) -> dict[str, float]:
        found = re.search(rf"^{line}.*$", out, re.MULTILINE)
        assert found, out
        return {tool: float(ms) for tool, ms in re.findall(r"(memory_\w+) (\d+\.\d+) ms", found.group(0))}

    front, database = per_call("front CPU per call"), per_call("database CPU per call")
    floor_line = re.search(r"^the MCP SDK's floor.*$", out, re.MULTILINE)
    floors = re.findall(r"(\d+\.\d+) ms \((\d{4}-\d\d-\d\d)\)", floor_line[0] if floor_line else "")
    assert [protocol for _, protocol in floors] == ["2026-07-28", "2025-11-25"], out  # the clients' revision first
    floor = float(floors[0][0])
    assert set(front) == set(database) == {"memory_context", "memory_search", "memory_store_episode"}, out
    assert 0 < floor < front["memory_context"], out  # a context block costs more than doing nothing
    assert all(ms > 0 for ms in database.values()), out  # every call reaches the database
    assert _redis_left_empty()


def test_decay_benchmark_runs_small(empty_database_url):
    out = _run(
        "bench_decay.py", "--facts", "2000", "--batch", "500", "--episodes", "800", "--database-url", empty_database_url
    )
    cleanup = re.search(r"cleanup batch=\s*500: (\d+) of 800 episodes deleted", out)
    sweeps = re.findall(r"batch=\s*500: 2,000 facts in [\d.]+ s = [\d,]+ rows/s, (\d+) batches, (\d+) changed", out)
    assert cleanup and int(cleanup[1]) > 0, out
    assert len(sweeps) == 2, out
    (first_batches, first_changed), (_, again_changed) = sweeps
    assert int(first_batches) >= 4 and int(first_changed) > 0, out  # about a tenth change band on the first sweep
    assert int(again_changed) == 0, out  # nothing left to change on the second


def test_episode_months_benchmark_runs_small(empty_database_url):
    out = _run("bench_episode_months.py", "--episodes", "1800", "--database-url", empty_database_url)
    before = re.search(r"row-by-row cleanup: ([\d,]+) episodes", out)
    months = re.search(r"episode cleanup: ([\d,]+) episodes in (\d+) months dropped \+ ([\d,]+) row by row", out)
    assert before and months and "upgrade to 0018 of 1,800 episodes" in out, out
    # every expired episode goes either way: five whole months dropped, the expired part of the last row by row
    assert int(before[1].replace(",", "")) == int(months[1].replace(",", "")) + int(months[3].replace(",", "")), out
    assert int(months[2]) == 5, out


def test_conversation_benchmark_runs_small(empty_database_url):
    # two personas, their first three queries: the real front, two real workers, the replay and both baselines
    small = ["--personas", "4,10", "--limit", "3", "--database-url", empty_database_url]
    small += ["--redis-url", SMALL_BENCH_REDIS_URL]
    out = _run(
        "bench_conversations.py",
        *small,
        env={"MEMORY_BUTLER_EMBEDDING__QUERY_CACHE_TTL_S": "0"},  # the timed searches wait out no cache
    )
    assert "=== dev split" in out and "=== test split" in out
    for system in ("memory_search (hybrid)", "rank-bm25", "dense (MiniLM)"):
        rows = [line for line in out.splitlines() if line.startswith(system) and " all " in line]
        assert len(rows) == 2, out
        for row in rows:
            values = [float(x) for x in re.findall(r"\d+\.\d{3}", row)]
            assert len(values) == 7 and all(0 <= v <= 1 for v in values), row
            # the first ten distinct sessions hold at least the top ten turns' sessions
            assert values[5] <= values[6], row
            # recall grows with depth
            assert values[0] <= values[1] <= values[2] <= values[3], row
    shares = _figures(out, "evidence in the block")
    assert len(shares) >= 2 and all(0 <= s <= 1 for s in shares[:2]), out
    # no answer was given up on: an empty degraded answer would pass for a miss
    assert out.count("degraded answers (empty, counted as misses): memory_search 0, memory_context 0") == 2, out
    p50, p95 = _figures(out, "memory_search via MCP", r"\d+\.\d")[-2:]
    assert 0 < p50 <= p95, out
    p50, p95 = _figures(out, "memory_context via MCP", r"\d+\.\d")[-2:]
    assert 0 < p50 <= p95, out
    search_cpu, context_cpu = _figures(out, "front CPU per call in these passes")
    assert 0 < search_cpu < 1000 and 0 < context_cpu < 1000, out
    assert redis_lib.Redis.from_url(SMALL_BENCH_REDIS_URL).dbsize() == 0
    # --reuse asks the same searches over the kept replay: nothing stored again, the same rankings
    again = _run("bench_conversations.py", *small, "--reuse")
    assert "stored by an earlier run (--reuse)" in again and "episodes stored in" not in again, again
    assert "evidence in the block" not in again, again
    assert _table(again) == _table(out), again


def test_conversation_benchmark_replays_a_locomo_file(empty_database_url):
    # LoCoMo's layout (tests/fixtures/locomo_sample.json): questions asked after the last session, through the front
    out = _run(
        "bench_conversations.py",
        *("--locomo", "tests/fixtures/locomo_sample.json", "--database-url", empty_database_url),
        *("--redis-url", SMALL_BENCH_REDIS_URL),
    )
    assert "=== LoCoMo (never tuned on) ===" in out and "LoCoMo samples 1: 2 queries, 5 episodes" in out, out
    [mine] = [line for line in out.splitlines() if line.startswith("memory_search (hybrid)") and " all " in line]
    values = [float(x) for x in re.findall(r"\d+\.\d{3}", mine)]
    # five turns, every one returned: all the evidence is in the top twenty
    assert len(values) == 7 and values[3] == 1.0, out
    assert 0 <= _figures(out, "evidence in the block")[0] <= 1, out
    assert redis_lib.Redis.from_url(SMALL_BENCH_REDIS_URL).dbsize() == 0


def _table(out: str) -> list[str]:
    """The benchmark's quality rows (not its timings)."""
    return [line for line in out.splitlines() if line.startswith(("memory_search (hybrid)", "rank-bm25", "dense"))]


def test_extraction_benchmark_runs_small():
    out = _run("bench_extraction.py", "--split", "dev", "--forms", "dialogue,smalltalk,rule")
    assert "reference (machine speed)" in out
    [row] = [line for line in out.splitlines() if line.startswith("heuristic")]
    cells = row.split()
    assert cells[:3] == [
        "heuristic",
        "dev",
        str(sum(1 for c in CASES if c.split == "dev" and c.form in ("dialogue", "smalltalk", "rule"))),
    ]
    precision, recall = float(cells[3]), float(cells[4])
    assert 0.5 <= precision <= 1 and 0.3 <= recall <= 1  # sane, not a target (the full run is in BENCHMARKS.md)
    out = _run("bench_extraction.py", "--realmem", "--personas", "6", "--sessions", "20", "--sample", "3")
    assert "RealMem coverage" in out and re.search(r"^6\s+20\s+\d+", out, re.MULTILINE)


def test_publisher_benchmark_runs_small():
    out = _run("bench_publisher.py", "--rate", "200", "--seconds", "1", "--redis-url", SMALL_BENCH_REDIS_URL)
    assert "reference (machine speed)" in out
    back_to_back = _figures(out, "gap 0 ms:", r"\d+(?:\.\d+)?")
    gapped = _figures(out, "gap 50 ms:", r"\d+(?:\.\d+)?")
    # CPU per offer, cores, rounds/s, offers, published, coalesced, dropped or failed
    assert back_to_back[3] == gapped[3] == 200 and back_to_back[6] == gapped[6] == 0
    assert back_to_back[4] == gapped[4] == 16  # each key's first wake-up; the rest found its marker set
    # a round per 50 ms gap (and the one that flushes), not one per offer
    assert gapped[2] <= 25 and back_to_back[2] > 2 * gapped[2]
    assert _redis_left_empty()


def test_fsync_benchmark_runs_small(tmp_path):
    out = _run("bench_fsync.py", "--dir", str(tmp_path), "--rate", "100", "--seconds", "1")
    assert "reference (machine speed)" in out
    found = re.search(r"(\d+) flushes at 100/s; p50 (\S+) ms, p99 (\S+) ms, p99.9 (\S+) ms, max (\S+) ms", out)
    assert found, out
    flushes, p50, p99, p999, worst = int(found[1]), *(float(x) for x in found.groups()[1:])
    assert flushes == 100 and 0 < p50 <= p99 <= p999 <= worst, out
    stalls = [int(n) for n in re.findall(r"\d+ ms: (\d+)", out)]
    assert len(stalls) == 3 and stalls[0] >= stalls[1] >= stalls[2] >= 0, out
    assert list(tmp_path.iterdir()) == []  # the scratch file is gone
