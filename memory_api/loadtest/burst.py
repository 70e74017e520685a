"""One load-test run: find the target, make the run's tenants, burst, drain, verify, report.

The target is the URL given (with its tokens and, for verification, its database URL), or the local stack
running for the data dir (its stack.json names the front and the database), or, for a fault drill, a fresh
stack this run starts and stops (:class:`memory_api.loadtest.chaos.LocalStack`).
"""

from __future__ import annotations

import asyncio
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from mcp_types.version import LATEST_MODERN_VERSION
from rich.console import Console
from sqlalchemy import Engine, text

from memory_api.loadtest import generator, report, verify
from memory_api.loadtest.chaos import Drill
from memory_api.loadtest.client import ClientConfig, Pacer, Reader, StartLine, Writer, call_tool, open_session
from memory_api.loadtest.localstack import LocalStack
from memory_api.loadtest.metrics import Recorder, cpu_seconds, cpu_used, run_sampler
from shared import db, heap
from shared.db import unit_of_work
from shared.tenancy import create_token, ensure_tenant

EXIT_PASSED, EXIT_FAILED, EXIT_SETUP = 0, 1, 3
READ_TOOLS = {"context": "memory_context", "search": "memory_search"}
CONNECT_TIMEOUT_S = 60.0  # the burst starts once every client connected, or after this long


class SetupError(RuntimeError):
    """The run cannot start (no target, a bad token, a stack that did not come up); nothing was measured."""


@dataclass
class BurstConfig:
    url: str | None = None
    tokens: dict[str, str] = field(default_factory=dict)  # tenant -> token, for deployments we do not own
    database_url: str | None = None
    data_dir: Path | None = None
    episodes: int = 1000
    clients: int = 50
    tenants: int = 2
    butlers: int = 4
    rate: float = 0.0
    batch: int = 0
    readers: int = 0
    read_rate: float = 50.0
    read_tool: str = "context"
    client: str = "mcp"  # the SDK's client, or "http": the lean one (memory_api.loadtest.jsonrpc)
    protocol: str = LATEST_MODERN_VERSION  # the MCP revision the clients speak (client.open_session)
    replay: bool = False
    chaos: str | None = None
    outage_s: float = 5.0
    chaos_at: float = 0.3
    out_dir: Path = Path("loadtest-out")
    drain_timeout_s: float = 300.0
    give_up_s: float = 180.0
    max_seconds: float = 1800.0
    create_tenants: bool | None = None
    seed: int = 1
    quiet: bool = False
    keep_stack: bool = False  # a drill's stack data dir (logs) is kept for a post-mortem


@dataclass(frozen=True)
class Target:
    """Where the run goes: the MCP URL, the database (for verification), and, for a local stack, its pids."""

    url: str
    database_url: str | None
    pids: dict[str, int] = field(default_factory=dict)  # part -> pid, for CPU accounting


def resolve_target(config: BurstConfig, stack: LocalStack | None = None) -> Target:
    """The drill's stack, else the given URL, else the local stack running for the data dir."""
    from memory_api.cli import stack as stack_cli

    if stack is not None:
        return Target(stack.url, stack.database_url, stack.pids())
    if config.url:
        return Target(config.url, config.database_url)
    from shared.config import load_settings

    data_dir = (config.data_dir or load_settings().data_dir).expanduser().resolve()
    record = stack_cli.read_stack(data_dir)
    front = (record or {}).get("parts", {}).get("front", {})
    if not record or record.get("state") != "running" or "url" not in front:
        raise SetupError(f"no running stack in {data_dir}: start one with `memory-butler up`, or pass --url")
    pids = {p["name"]: p["pid"] for p in record.get("processes", [])}
    if (record.get("postgres") or {}).get("embedded"):
        pids["postgres"] = stack_cli.postmaster_pid(Path(record["postgres"]["pgdata"])) or 0
    return Target(front["url"], config.database_url or record.get("database_url"), {k: v for k, v in pids.items() if v})


def make_tenants(engine: Engine, tenants: list[generator.TenantPlan], run_id: str) -> dict[str, str]:
    """Create the run's tenants and one butler token each (covering the run's butlers)."""
    tokens = {}
    with unit_of_work(engine) as conn:
        for tenant in tenants:
            ensure_tenant(conn, tenant_id=tenant.tenant_id)
            _, tokens[tenant.tenant_id] = create_token(
                conn, tenant_id=tenant.tenant_id, name=f"loadtest-{run_id}", butlers=list(tenant.butlers), role="butler"
            )
    return tokens


async def preflight(url: str, tokens: dict[str, str]) -> None:
    """Every token opens a session and reads once, so a wrong URL or token fails now, not as endless retries."""
    for tenant, token in tokens.items():
        try:
            async with open_session(url, token, timeout_s=30) as session:
                await call_tool(session, "memory_stats", {}, timeout_s=30)
        except Exception as exc:  # noqa: BLE001 - report any failure as a setup error with its cause
            raise SetupError(f"cannot use the token of {tenant} at {url}: {type(exc).__name__}: {exc}") from exc


def _queries(seed: int) -> list[str]:
    rng = random.Random(seed)
    return [
        f"What should I know about {generator.episode_text(rng, butler).split('.')[0].lower()}?"
        for butler in generator.BUTLER_NAMES
        for _ in range(8)
    ]


async def burst(config: BurstConfig, *, stack: LocalStack | None = None, console: Console | None = None) -> dict:
    """The whole run; returns every figure (``failures`` is empty when verification passed)."""
    console = console or Console(stderr=True)
    target = resolve_target(config, stack)
    url, run_id = target.url, generator.new_run_id()
    engine = db.make_engine(target.database_url, pool_size=2) if target.database_url else None
    try:
        tenants = generator.plan_tenants(
            run_id,
            count=len(config.tokens) or config.tenants,
            butlers=config.butlers,
            tenant_ids=list(config.tokens) or None,
        )
        create = config.create_tenants if config.create_tenants is not None else not config.tokens
        if not create:
            tokens = dict(config.tokens)
        elif engine is None:
            raise SetupError("creating tenants needs --database-url (or pass --token TENANT=TOKEN pairs)")
        else:
            tokens = await asyncio.to_thread(make_tenants, engine, tenants, run_id)
        await preflight(url, tokens)
        reference = await asyncio.to_thread(machine_reference)
        # The generator's own full collections (140-270 ms) stalled every call in flight and were timed as the
        # service's latency: its start-up heap out of their sight (shared.heap).
        heap.settle()
        return await _run(
            config,
            target=target,
            engine=engine,
            run_id=run_id,
            tenants=tenants,
            tokens=tokens,
            stack=stack,
            console=console,
            reference=reference,
        )
    finally:
        if engine is not None:
            engine.dispose()


def machine_reference() -> str:
    """The benchmarks' machine-speed line, measured in this process before the burst (a figure is read beside
    it: this machine's speed varies from hour to hour); what went wrong if it could not be measured."""
    from shared.embedding import reference_line  # loads the model: only when a burst runs

    try:
        return reference_line()
    except Exception as exc:  # noqa: BLE001 - the run goes on without it
        return f"reference (machine speed): not measured ({type(exc).__name__}: {exc})"


@dataclass
class _Signals:
    """What the run's tasks wait on: the writers are done, the backlog drained, the sampler may stop."""

    writers_done: asyncio.Event = field(default_factory=asyncio.Event)
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    sampler_stop: asyncio.Event = field(default_factory=asyncio.Event)


def _clients(
    config: BurstConfig,
    url: str,
    run_id: str,
    tenants: list[generator.TenantPlan],
    tokens: dict[str, str],
    recorder: Recorder,
    stop: asyncio.Event,
    start: StartLine,
) -> tuple[list[Writer], list[Reader]]:
    """One writer per client (dealt to tenants round-robin) and the readers, all sharing the recorder.

    The writers share one pacer, and so do the readers: calls go out evenly spaced at the offered rate. (A pacer
    per reader kept every reader's slots in step with the others', so all the reads of a round arrived at once.)
    """
    client_config = ClientConfig(
        url=url,
        give_up_s=config.give_up_s,
        replay=config.replay or config.chaos == "replay",
        batch=config.batch,
        client=config.client,
        protocol=config.protocol,
    )
    pacer, read_pacer, writers = Pacer(config.rate), Pacer(config.read_rate), []
    for client, count in enumerate(generator.split_evenly(config.episodes, config.clients)):
        tenant = generator.client_tenant(client, tenants)
        plan = generator.client_episodes(run_id, client=client, count=count, tenant=tenant, seed=config.seed)
        writers.append(Writer(client_config, tokens[tenant.tenant_id], plan, recorder, pacer, stop, start))
    readers = [
        Reader(
            url,
            tokens[tenants[i % len(tenants)].tenant_id],
            READ_TOOLS[config.read_tool],
            tenants[i % len(tenants)].butlers,
            _queries(config.seed + i),
            recorder,
            read_pacer,
            stop,
            start,
            client=config.client,
            protocol=config.protocol,
        )
        for i in range(config.readers)
    ]
    return writers, readers


async def _run(
    config: BurstConfig,
    *,
    target: Target,
    engine: Engine | None,
    run_id: str,
    tenants: list[generator.TenantPlan],
    tokens: dict[str, str],
    stack: LocalStack | None,
    console: Console,
    reference: str,
) -> dict:
    tenant_ids = [t.tenant_id for t in tenants]
    baseline = await asyncio.to_thread(_stored, engine, tenant_ids) if engine is not None else 0
    recorder, signals = Recorder(), _Signals()
    start = StartLine(expected=0)
    writers, readers = _clients(config, target.url, run_id, tenants, tokens, recorder, signals.writers_done, start)
    start.expected = sum(1 for w in writers if w.queue) + len(readers)  # a writer with nothing to send never calls
    drill = Drill(config.chaos, stack, config.outage_s, config.chaos_at) if config.chaos and stack else None
    keys = [(t.tenant_id, b) for t in tenants for b in t.butlers]
    pids = {**target.pids, "loadtest": os.getpid()}
    with report.live(console, quiet=config.quiet) as live:
        live.phase("burst", config.episodes)
        running = [asyncio.create_task(w.run()) for w in writers]
        side = [asyncio.create_task(r.run()) for r in readers]
        await start.open_when_ready(CONNECT_TIMEOUT_S)
        cpu_before = await asyncio.to_thread(cpu_seconds, pids)
        sampler = asyncio.create_task(
            run_sampler(recorder, engine, tenant_ids, baseline=baseline, stop=signals.sampler_stop)
        )
        drill_task = (
            asyncio.create_task(
                drill.run(
                    recorder, target=config.episodes, done=signals.writers_done, drained=signals.drained, keys=keys
                )
            )
            if drill
            else None
        )
        side.append(asyncio.create_task(_tick(live, recorder, signals)))
        try:
            await asyncio.wait_for(asyncio.gather(*running), config.max_seconds)
        except TimeoutError:
            recorder.counts["stopped_at_max_seconds"] += 1
        recorder.burst_ended = recorder.now()
        signals.writers_done.set()
        burst_s = recorder.burst_ended - min((a.first_sent_at for a in recorder.accepts), default=0.0)
        cpu = cpu_used(
            cpu_before, await asyncio.to_thread(cpu_seconds, pids), episodes=len(recorder.accepts), seconds=burst_s
        )
        await asyncio.gather(*side)
        if drill_task and config.chaos != "replay":  # what a drill broke is restored before the drain counts
            await drill_task
        drained = await asyncio.to_thread(_drain, engine, tenant_ids, config.drain_timeout_s, live) if engine else None
        drained_at = recorder.now()
        signals.drained.set()
        signals.sampler_stop.set()
        await asyncio.gather(sampler, *([drill_task] if drill_task else []))
    figures = report.figures(
        config,
        recorder,
        url=target.url,
        run_id=run_id,
        tenants=tenants,
        drained=drained,
        drained_at=drained_at,
        cpu=cpu,
        has_drill=drill is not None,
        reference=reference,
    )
    await _verify(
        figures,
        recorder,
        engine=engine,
        tenants=tenants,
        tokens=tokens,
        url=target.url,
        stack=stack,
        run_id=run_id,
        chaos=config.chaos if drill else None,
    )
    return report.write(config.out_dir, figures, recorder, console)


async def _verify(
    figures: dict,
    recorder: Recorder,
    *,
    engine: Engine | None,
    tenants: list[generator.TenantPlan],
    tokens: dict[str, str],
    url: str,
    stack: LocalStack | None,
    run_id: str,
    chaos: str | None,
) -> None:
    """The database checks, the isolation probe, the drill's own checks; every broken promise in ``failures``."""
    if engine is not None:
        figures["database"] = await asyncio.to_thread(
            verify.check_database, engine, accepts=recorder.accepts, tenants=tenants, run_tag=f"lt{run_id}t"
        )
    figures["isolation"] = await verify.probe_isolation(url, tenants, tokens) if len(tenants) > 1 else None
    figures["dead_parts"] = await asyncio.to_thread(stack.dead_parts) if stack else []
    figures["failures"] = verify.verdict(figures)
    if chaos and chaos != "replay" and not recorder.window(chaos):
        figures["failures"].append(f"the {chaos} drill never fired (the burst ended first): raise --episodes")


async def _tick(live: report.Live, recorder: Recorder, signals: _Signals) -> None:
    while not signals.writers_done.is_set():
        live.update(len(recorder.accepts), report.burst_info(recorder))
        await asyncio.sleep(0.25)
    live.update(len(recorder.accepts), report.burst_info(recorder))


def _drain(engine: Engine, tenant_ids: list[str], timeout_s: float, live: report.Live) -> bool:
    seen = {"max": 0}
    live.phase("drain", 1)

    def on_poll(state: dict[str, int] | None) -> None:
        if state is None:
            live.update(0, "database unreachable")
            return
        left = state["pending_intents"] + state["due"]
        seen["max"] = max(seen["max"], left)
        live.update(
            seen["max"] - left, f"{state['pending_intents']} intents, {state['due']} episodes due", total=seen["max"]
        )

    return verify.wait_for_drain(engine, tenant_ids, timeout_s=timeout_s, on_poll=on_poll)


def _stored(engine: Engine, tenant_ids: list[str]) -> int:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT count(*) FROM episodes WHERE tenant_id = ANY(:t)"), {"t": tenant_ids}
        ).scalar_one()


def run(config: BurstConfig) -> int:
    """The command: start a stack for a drill (and stop it after), run, and answer the exit code."""
    try:
        if config.chaos:
            if config.url:
                raise SetupError("--chaos drills run only on a stack they start themselves; drop --url")
            stack = LocalStack(keep=config.keep_stack)
            try:
                stack.start()
            except (RuntimeError, OSError) as exc:
                stack.stop()
                raise SetupError(f"the drill's stack did not start: {exc}") from exc
            try:
                figures = asyncio.run(burst(config, stack=stack))
            finally:
                stack.stop()
                if config.keep_stack:
                    Console(stderr=True).print(f"kept the drill's stack data and logs in {stack.data_dir}")
        else:
            figures = asyncio.run(burst(config))
    except SetupError as exc:
        Console(stderr=True).print(f"[red]memory-butler loadtest: {exc}[/]")
        return EXIT_SETUP
    return EXIT_FAILED if figures["failures"] else EXIT_PASSED
