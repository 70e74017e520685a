"""Reads and accepts through the MCP front, with the raw database queries beside them.

    python tests/bench/bench_mcp.py [--facts 100000] [--rules 20000] [--tenants 100] [--clients 20] [--seconds 30]

Loads the corpus (tests/bench/corpus.py), starts `memory-butler serve` on a free port against it, then:
- raw: the candidate SQL alone (semantic + keyword, facts and rules) for the same questions, in-process; and the
  CPU time of one keyed accept's database work (shared.intake), the front's first try against the key look-up;
- reads: C concurrent MCP clients (one session each, one tenant token each) calling memory_context, then
  memory_search, back to back for S seconds each;
- accepts: C clients calling memory_store_episode, then memory_ingest_batch (50 episodes per call); each
  episode with an idempotency key, as a butler that retries safely sends it (and as `loadtest burst` does);
- front CPU per call: one client calling each tool back to back for S/3 seconds, the front process's CPU time
  (every thread: HTTP, MCP, embedding, driver) divided by the calls - what a call costs the front's cores; and
  beside it the same for a no-op tool on the same SDK and transport (tests/bench/noop_front.py): the floor, on
  both MCP revisions (2026-07-28, self-contained requests; 2025-11-25, the initialize handshake).
--protocol picks the revision every client speaks (default 2026-07-28, what the SDK's Client negotiates).
No worker runs, so accepted writes stay in the intake: this measures the front alone. Its Redis database
(--redis-url, default 15 or BENCH_REDIS_URL) is flushed before and after, so the messages it queues do not
outlive it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
from mcp_types.version import LATEST_MODERN_VERSION
from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from memory_api.loadtest.client import PROTOCOLS, call_tool, open_session  # noqa: E402
from shared.candidates import Filter  # noqa: E402
from shared import candidates, db, heap, intake  # noqa: E402
from shared.db import unit_of_work  # noqa: E402
from shared.embedding import get_embedder, to_pgvector  # noqa: E402
from shared.tenancy import create_token  # noqa: E402
from tests.bench.common import BENCH_REDIS_URL, bench_engine, bench_redis, reference_line, run_benchmark  # noqa: E402
from tests.bench.corpus import corpus_tenants, questions  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_front(database_url: str, redis_url: str, port: int, workers: int = 1) -> subprocess.Popen:
    env = {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url, "MEMORY_BUTLER_LOG_LEVEL": "WARNING"}
    serve = ["memory_api", "serve", "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]
    return _started(serve, port, env)


def start_noop_front(port: int) -> subprocess.Popen:
    """tests/bench/noop_front.py: the SDK serving one no-op tool as the front serves its tools."""
    return _started(["tests.bench.noop_front", str(port)], port, dict(os.environ))


def _started(module_args: list[str], port: int, env: dict[str, str]) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", *module_args],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    raise TimeoutError(f"{module_args[0]} did not become healthy")


def pct(values: list[float], p: float) -> float:
    return float(np.percentile(np.array(values) * 1000, p)) if values else float("nan")


def raw_queries(engine, tenants: list[str], qs: list[str], n: int = 200) -> list[float]:  # noqa: ANN001
    """The candidate SQL alone (what every read runs), with the query vector precomputed."""
    rng = random.Random(9)
    embedder = get_embedder()
    vectors = {q: to_pgvector(embedder.embed_one(q)) for q in qs}
    out = []
    for i in range(n):
        q = qs[i % len(qs)]
        f = Filter(
            tenant_id=rng.choice(tenants),
            scopes=("global", "health"),
            butlers=("health",),
            min_confidence=0.2,
            now=datetime.now(timezone.utc),
        )
        t0 = time.perf_counter()
        with engine.connect() as conn, conn.begin():
            conn.execute(text(candidates.read_settings(pool=50, timeout_ms=2000)))
            candidates.gather(conn, kinds=("fact", "rule"), f=f, query=q, query_vec=vectors[q], pool=50)
        out.append(time.perf_counter() - t0)
    return out


def raw_accepts(engine, tenant: str, n: int = 600) -> dict[bool, list[float]]:  # noqa: ANN001
    """CPU time (this process: the driver, and SQLAlchemy on the look-up path) per accept of one keyed episode,
    in-process, alternating the front's first try (intake.accept_fresh: one statement, on the event loop) with the
    look-up path (a replay's, on a thread in the front), so both see the same machine."""
    out: dict[bool, list[float]] = {False: [], True: []}

    async def run() -> None:
        async with db.make_async_pool(engine.url.render_as_string(hide_password=False), size=1) as pool:
            async with pool.connection() as aconn:
                for i in range(n):
                    look_up = bool(i % 2)
                    write = intake.WriteRequest(
                        "episode", "health", {"content": f"raw accept {i}", "butler": "health"}, uuid.uuid4().hex
                    )
                    t0 = time.process_time()
                    if look_up:
                        with unit_of_work(engine) as conn:
                            intake.accept(conn, tenant_id=tenant, writes=[write], actor="health", request_id=None)
                    else:
                        await intake.accept_fresh(
                            aconn, tenant_id=tenant, writes=[write], actor="health", request_id=None
                        )
                    out[look_up].append(time.process_time() - t0)

    asyncio.run(run())
    return out


async def read_loop(
    url: str, token: str, tool: str, qs: list[str], seconds: float, out: list[float], protocol: str
) -> None:
    rng = random.Random(token)
    async with open_session(url, token, timeout_s=30, protocol=protocol) as session:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            q = rng.choice(qs)
            t0 = time.perf_counter()
            await call_tool(session, tool, _args(tool, q), timeout_s=30)
            out.append(time.perf_counter() - t0)


async def accept_loop(url: str, token: str, batch: int, calls: int, out: list[float], protocol: str) -> None:
    async with open_session(url, token, timeout_s=30, protocol=protocol) as session:
        for i in range(calls):
            text = f"User asked about the weekly schedule, item {i} ({uuid.uuid4().hex[:8]})"
            t0 = time.perf_counter()
            if batch:
                episodes = [{"content": f"{text} part {j}", "butler": "health"} for j in range(batch)]
                await call_tool(session, "memory_ingest_batch", {"episodes": episodes}, timeout_s=30)
            else:
                episode = {"content": text, "butler": "health", "idempotency_key": uuid.uuid4().hex}
                await call_tool(session, "memory_store_episode", episode, timeout_s=30)
            out.append(time.perf_counter() - t0)


CPU_TOOLS = ("memory_context", "memory_search", "memory_store_episode")


def _args(tool: str, q: str) -> dict:
    if tool == "memory_context":
        return {"trigger_prompt": q, "butler": "health", "token_budget": 3000}
    if tool == "memory_search":
        return {"query": q, "limit": 20}
    return {"content": f"{q} ({uuid.uuid4().hex[:8]})", "butler": "health", "idempotency_key": uuid.uuid4().hex}


async def cpu_per_call(
    url: str,
    token: str,
    front: psutil.Process,
    database: psutil.Process | None,
    qs: list[str],
    seconds: float,
    protocol: str,
) -> dict[str, tuple[float, float | None]]:
    """Milliseconds of front CPU (user + system, all threads) and of the database server's (every process of its
    cluster; None if it is not on this machine) per call, one client calling back to back."""
    rng = random.Random(3)
    out = {}
    async with open_session(url, token, timeout_s=30, protocol=protocol) as session:
        for tool in CPU_TOOLS:
            for q in qs[:5]:  # warm: plans prepared, token counts cached
                await call_tool(session, tool, _args(tool, q), timeout_s=30)
            out[tool] = await _cpu_ms_per_call(
                session, front, tool, lambda t=tool: _args(t, rng.choice(qs)), seconds, database=database
            )
    return out


async def _cpu_ms_per_call(
    session: Any,
    server: psutil.Process,
    tool: str,
    args: Callable[[], dict],
    seconds: float,
    *,
    database: psutil.Process | None = None,
) -> tuple[float, float | None]:
    """Calls ``tool`` back to back for ``seconds``; the server's and the database's CPU milliseconds per call."""
    calls, before, db_before = 0, _cpu_s(server), _cpu_s(database) if database else 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        await call_tool(session, tool, args(), timeout_s=30)
        calls += 1
    db_ms = 1000 * (_cpu_s(database) - db_before) / calls if database else None
    return 1000 * (_cpu_s(server) - before) / calls, db_ms


def postmaster(engine) -> psutil.Process | None:  # noqa: ANN001
    """The database server's main process, when it runs on this machine (its backends are its children)."""
    with engine.connect() as conn:
        backend = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        try:
            return psutil.Process(backend).parent()
        except psutil.Error:
            return None


def sdk_floor(seconds: float, protocol: str) -> float:
    """Milliseconds of CPU per call of a no-op tool on the same SDK and transport (one client, back to back)."""
    port = free_port()
    noop = start_noop_front(port)
    try:
        return asyncio.run(_noop_calls(f"http://127.0.0.1:{port}/mcp", psutil.Process(noop.pid), seconds, protocol))
    finally:
        os.killpg(noop.pid, signal.SIGTERM)
        noop.wait(timeout=30)


async def _noop_calls(url: str, server: psutil.Process, seconds: float, protocol: str) -> float:
    async with open_session(url, "unused", timeout_s=30, protocol=protocol) as session:
        for _ in range(20):
            await call_tool(session, "noop", {"text": "warm"}, timeout_s=30)
        return (await _cpu_ms_per_call(session, server, "noop", lambda: {"text": "hello"}, seconds))[0]


def _cpu_s(front: psutil.Process) -> float:
    """CPU seconds of the front and, with --front-workers > 1, of its worker processes; of a postmaster, its
    backends' too (those that ended included: it reaps them).

    Live threads are read to the nanosecond (``/proc/<pid>/task/<tid>/schedstat``): ``cpu_times`` counts whole
    clock ticks (10 ms), more than a short run's accepts cost PostgreSQL. Reaped children only come in ticks."""
    ended = front.cpu_times()
    total = ended.children_user + ended.children_system
    for proc in (front, *front.children(recursive=True)):
        total += _threads_cpu_s(proc.pid)
    return total


def _threads_cpu_s(pid: int) -> float:
    """Time on a CPU of the process's live threads (0 for a process that has ended)."""
    total_ns = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total_ns += int(stat.read_text().split()[0])
        except (OSError, IndexError, ValueError):  # the thread ended while we looked
            continue
    return total_ns / 1e9


async def run_clients(factories) -> float:  # noqa: ANN001
    t0 = time.perf_counter()
    await asyncio.gather(*factories)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--facts", type=int, default=100_000)
    parser.add_argument("--rules", type=int, default=20_000)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--accepts", type=int, default=100, help="store_episode calls per client")
    parser.add_argument("--database-url")
    parser.add_argument("--reuse", action="store_true", help="the database already holds the corpus: skip loading")
    parser.add_argument("--redis-url", default=BENCH_REDIS_URL, help="flushed before and after")
    parser.add_argument("--front-workers", type=int, default=1, help="front processes (serve --workers)")
    parser.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default=LATEST_MODERN_VERSION,
        help="the MCP revision the clients speak (memory_api.loadtest.client.open_session); the floor is printed "
        "for both",
    )
    args = parser.parse_args()
    qs = questions(random.Random(5), 200)
    with bench_redis(args.redis_url), bench_engine(args.database_url) as engine:
        tenants = corpus_tenants(engine, reuse=args.reuse, facts=args.facts, rules=args.rules, tenants=args.tenants)
        with engine.begin() as conn:
            tokens = [
                create_token(conn, tenant_id=t, name="bench", butlers=["health"], role="butler")[1]
                for t in tenants[: args.clients]
            ]
        raw = raw_queries(engine, tenants, qs)
        raw_accept = raw_accepts(engine, tenants[0])
        port = free_port()
        front = start_front(engine.url.render_as_string(hide_password=False), args.redis_url, port, args.front_workers)
        url = f"http://127.0.0.1:{port}/mcp"
        heap.settle()  # the client's own full collections are not the service's latency
        try:
            cpu = asyncio.run(
                cpu_per_call(
                    url, tokens[0], psutil.Process(front.pid), postmaster(engine), qs, args.seconds / 3, args.protocol
                )
            )
            floors = {p: sdk_floor(args.seconds / 3, p) for p in sorted(PROTOCOLS, key=lambda p: p != args.protocol)}
            results: dict[str, list[float]] = {}
            for tool in ("memory_context", "memory_search"):
                results[tool] = []
                asyncio.run(
                    run_clients(
                        [read_loop(url, tok, tool, qs, args.seconds, results[tool], args.protocol) for tok in tokens]
                    )
                )
            single: list[float] = []
            single_s = asyncio.run(
                run_clients([accept_loop(url, tok, 0, args.accepts, single, args.protocol) for tok in tokens])
            )
            batched: list[float] = []
            batch_calls = max(1, args.accepts // 10)
            batch_s = asyncio.run(
                run_clients([accept_loop(url, tok, 50, batch_calls, batched, args.protocol) for tok in tokens])
            )
        finally:
            os.killpg(front.pid, signal.SIGTERM)
            front.wait(timeout=30)
    print(f"\n{reference_line()}")
    print(
        f"{args.facts} facts + {args.rules} rules, {args.tenants} tenants; {args.clients} concurrent MCP clients; "
        f"{args.front_workers} front process(es); MCP {args.protocol}"
    )
    print(f"{'what':<44}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'rate/s':>9}")
    print(f"{'raw candidate SQL (gather, in-process)':<44}{pct(raw, 50):>9.1f}{pct(raw, 95):>9.1f}{pct(raw, 99):>9.1f}")
    for look_up, label in ((False, "first try"), (True, "key look-up")):
        values = raw_accept[look_up]
        print(f"{'raw accept CPU, ' + label + ' (in-process)':<44}{pct(values, 50):>9.2f}{pct(values, 95):>9.2f}")
    for tool, values in results.items():
        print(
            f"{tool + ' via MCP':<44}{pct(values, 50):>9.1f}{pct(values, 95):>9.1f}{pct(values, 99):>9.1f}"
            f"{len(values) / args.seconds:>9.0f}"
        )
    print(
        f"{'memory_store_episode accept via MCP':<44}{pct(single, 50):>9.1f}{pct(single, 95):>9.1f}"
        f"{pct(single, 99):>9.1f}{len(single) / single_s:>9.0f}"
    )
    per_episode = [v / 50 for v in batched]
    print(
        f"{'memory_ingest_batch(50) call via MCP':<44}{pct(batched, 50):>9.1f}{pct(batched, 95):>9.1f}"
        f"{pct(batched, 99):>9.1f}{50 * len(batched) / batch_s:>9.0f}"
    )
    print(
        f"{'  … per episode':<44}{pct(per_episode, 50):>9.2f}{pct(per_episode, 95):>9.2f}{pct(per_episode, 99):>9.2f}"
    )
    print(
        "front CPU per call (one client, back to back): "
        + ", ".join(f"{tool} {ms:.2f} ms" for tool, (ms, _) in cpu.items())
    )
    if all(db_ms is not None for _, db_ms in cpu.values()):
        print("database CPU per call (the same calls): " + ", ".join(f"{t} {ms:.2f} ms" for t, (_, ms) in cpu.items()))
    print(
        "the MCP SDK's floor, a no-op tool served the same way: "
        + "; ".join(f"{ms:.2f} ms ({protocol})" for protocol, ms in floors.items())
    )
    return 0


if __name__ == "__main__":
    run_benchmark(main)
