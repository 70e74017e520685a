"""Conversation retrieval benchmark on the RealMem dev set, through the real MCP front and real workers.

    python tests/bench/bench_conversations.py [--split dev|test|all] [--personas 1,2] [--limit N] [--workers 2]
    python tests/bench/bench_conversations.py --locomo path/to/locomo10.json [--personas 1,2]

Every turn of every session becomes an episode of its persona's tenant ("<Speaker>: <text>", the session as
session_id, the session's time as occurred_at), stored through memory_ingest_batch. Sessions are replayed in time
order: before a session that holds queries, the harness waits until every episode stored so far is applied, then
asks each query with memory_search(types=["episode"], limit=20, until=<the session's start>) and
memory_context(trigger_prompt, butler, token_budget=1000) - so both see only earlier sessions, as a butler would.

Scored against the evidence turns (tests/bench/conversations.py, the dataset README's rule): turn-level R@1/5/10/20,
nDCG@10 and session-level R@10 two ways (S-R@10: the sessions of the top ten turns; S-R@10d: the first ten distinct
sessions of the ranking, LongMemEval's turn-to-session evaluation), overall and per category, beside two baselines computed in the same run on the same
turns: rank-bm25 (BM25Okapi, lower-cased word tokens, no stemming) and dense (cosine on the episode's own stored
MiniLM embedding). "In block" is the share of queries with an evidence turn's first 60 characters (whitespace-folded)
in the memory_context block, beside rank-bm25's top turns packed into the same 1,000 tokens (the model's tokenizer).
Then a single client repeats the largest persona's searches three times over on the idle stack for memory_search
p50/p95 (the front reuses no query embedding in this run: each timed search embeds its question), asks the same
questions of memory_context (over every session: latency and cost, not scored), and prints the front process's CPU
per call of each pass: what a conversation tenant's read costs the front.

With --database-url D the replay is kept in D; --reuse then asks the searches again over it without storing
anything (a few minutes instead of half an hour), e.g. to compare retrieval settings given as
MEMORY_BUTLER_MEMORY__RETRIEVAL__* variables (the front reads them). It skips memory_context, which has no time
bound: over the whole kept replay it would see the question's own and later sessions.

Consolidation is off during the run (consolidation.after_apply=false; no beat): this measures retrieval over the
episodes. With --consolidate it is on: each wait also waits for consolidation, searches ask for facts, rules and
episodes, and a fact or rule counts as the turn it was learned from (its source episode) - in the ranking and in
the block - so the table shows whether what consolidation learns helps. Tune on --split dev (personas 1-5), report --split test (6-10). Dataset: RealMem (arXiv 2601.06966),
Apache-2.0, ../shared/datasets/realmem.

With --locomo FILE the same replay runs on LoCoMo (arXiv 2402.17753; its data/locomo10.json, CC BY-NC 4.0, so not
shipped): each conversation a tenant, each turn an episode (an image's caption appended), every question of
categories 1-4 asked after the conversation's last session, scored against the turns its evidence ids name. Nothing
was tuned on it: it shows whether the weights chosen on RealMem carry over to another set.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import signal
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import psutil
from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from memory_api.loadtest.client import call_tool, open_session  # noqa: E402
from shared import heap  # noqa: E402
from shared.config import load_settings  # noqa: E402
from shared.embedding import get_embedder, get_token_counter  # noqa: E402
from shared.schemas import MAX_CONTENT  # noqa: E402
from shared.tenancy import create_token, ensure_tenant  # noqa: E402
from tests.bench import conversations as rm  # noqa: E402
from tests.bench.bench_drain import start_workers, wait_ready  # noqa: E402
from tests.bench.bench_mcp import free_port, pct, start_front  # noqa: E402
from tests.bench.common import BENCH_REDIS_URL, bench_engine, bench_redis, reference_line, run_benchmark  # noqa: E402

BUTLER = "assistant"
# The timed searches: each asked question this many times over (a p95 over a few hundred searches).
LATENCY_ROUNDS = 3
BUDGET = 1000
PREFIX = 60
BATCH = 500


class Run:
    """One persona's replay: episode ids by turn key, rankings and blocks by query, timings."""

    def __init__(self, number: int, persona: rm.Persona, token: str, tenant: str) -> None:
        self.number, self.persona, self.token, self.tenant = number, persona, token, tenant
        self.keys: dict[str, tuple[int, int]] = {}
        self.ranked: dict[str, list[tuple[int, int]]] = {}
        self.blocks: dict[str, str] = {}
        self.included: dict[str, set[str]] = {}
        self.search_s: list[float] = []
        self.degraded: Counter[str] = Counter()  # answers the front gave up on (fail open): empty, counted as misses
        self.derived: dict[str, tuple[int, int]] = {}  # fact/rule id -> the turn it was learned from


TYPES = ["episode"]


async def replay(run: Run, url: str, engine, limit: int | None, with_context: bool, rewake) -> None:  # noqa: ANN001
    """Store the persona's sessions in order; ask each query once everything before its session is applied.

    ``rewake`` None (--reuse): the episodes are already stored (a kept database); only the queries are asked."""
    started = time.monotonic()
    if rewake is None:
        _stored(run, engine)
    asked = {q.query_id for q in (run.persona.queries[:limit] if limit else run.persona.queries)}
    queries = defaultdict(list)
    for q in run.persona.queries:
        if q.query_id in asked:
            queries[q.session].append(q)
    by_session = defaultdict(list)
    for t in run.persona.turns:
        by_session[t.key[0]].append(t)
    pending: list[rm.Turn] = []
    last = max(queries, default=0)
    async with open_session(url, run.token, timeout_s=120) as session:
        # A query's session may follow the last one (LoCoMo asks every question after the whole conversation).
        for s in sorted(set(by_session) | set(queries)):
            if queries.get(s):
                if rewake is not None:
                    await _store(session, run, pending)
                    pending = []
                    await asyncio.to_thread(_wait_applied, engine, run.tenant, lambda: rewake(run.tenant))
                for q in queries[s]:
                    await _ask(session, run, q, _until(run.persona, q), with_context)
            pending += by_session.get(s, [])
            if s >= last:
                break  # nothing is asked after this session: its turns would never be searched
    print(
        f"persona {run.number} replayed: {len(run.keys)} episodes, {len(asked)} queries asked, "
        f"{time.monotonic() - started:.0f} s",
        file=sys.stderr,
        flush=True,
    )


def _until(persona: rm.Persona, q: rm.Query) -> str:
    """The time bound of a query's search: the start of its session (only earlier sessions count), or the query's
    own time when it follows the last session."""
    starts = (t.occurred_at for t in persona.turns if t.key[0] == q.session)
    return next(starts, q.occurred_at).isoformat()


def _stored(run: Run, engine) -> None:  # noqa: ANN001
    """--reuse: the turn keys of the episodes an earlier run stored, by when each turn happened (a persona's turn
    times strictly increase; some turns repeat an earlier one's text)."""
    turns = {t.occurred_at: t.key for t in run.persona.turns}
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id::text, occurred_at FROM episodes WHERE tenant_id = :t"), {"t": run.tenant}
        ).all()
    run.keys.update({i: turns[when] for i, when in rows if when in turns})
    if not run.keys:
        raise SystemExit(f"--reuse: persona {run.number} has no stored episodes in this database")


async def _store(session, run: Run, turns: list[rm.Turn]) -> None:  # noqa: ANN001
    for start in range(0, len(turns), BATCH):
        chunk = turns[start : start + BATCH]
        # The few turns over the episode cap (memory_store_episode takes 20,000 characters) are cut there, as an
        # importer would have to; the evidence check reads a turn's first 60 characters.
        episodes = [
            {
                "content": t.content[:MAX_CONTENT],
                "butler": BUTLER,
                "session_id": str(t.session_id),
                "occurred_at": t.occurred_at.isoformat(),
            }
            for t in chunk
        ]
        body = await call_tool(session, "memory_ingest_batch", {"episodes": episodes}, timeout_s=120)
        run.keys.update({item["id"]: t.key for item, t in zip(body["items"], chunk, strict=True)})


def _wait_applied(engine, tenant: str, rewake, deadline_s: float = 1800) -> None:  # noqa: ANN001
    """Until the tenant has no unapplied write; with no progress for 30 s the wake-up is sent again (what beat's
    redelivery sweep does on a real stack; a wake-up is lost e.g. when another benchmark empties the Redis db)."""
    t0 = last_change = time.monotonic()
    last = None
    while time.monotonic() - t0 < deadline_s:
        with engine.connect() as conn:
            left = conn.execute(
                text("SELECT count(*) FROM write_intents WHERE tenant_id = :t AND status <> 'applied'"), {"t": tenant}
            ).scalar()
            if not left and len(TYPES) > 1:  # --consolidate: and consolidated
                left = conn.execute(
                    text("SELECT count(*) FROM episodes WHERE tenant_id = :t AND consolidation_status = 'pending'"),
                    {"t": tenant},
                ).scalar()
        if not left:
            return
        if left != last:
            last, last_change = left, time.monotonic()
        elif time.monotonic() - last_change > 30:
            rewake()
            last_change = time.monotonic()
        time.sleep(0.1)
    raise TimeoutError(f"{tenant}: episodes not applied")


def _search_arguments(q: rm.Query, until: str, types: list[str]) -> dict:
    return {"query": q.text, "types": types, "limit": 20, "until": until}


def _context_arguments(q: rm.Query) -> dict:
    return {"trigger_prompt": q.text, "butler": BUTLER, "token_budget": BUDGET}


async def _ask(session, run: Run, q: rm.Query, until: str, with_context: bool) -> None:  # noqa: ANN001
    t0 = time.perf_counter()
    body = await call_tool(session, "memory_search", _search_arguments(q, until, TYPES), timeout_s=60)
    run.search_s.append(time.perf_counter() - t0)
    run.degraded["memory_search"] += body["degraded"]
    run.ranked[q.query_id] = [h["id"] for h in body["results"]]  # turned into turn keys by resolve()
    if with_context:
        body = await call_tool(session, "memory_context", _context_arguments(q), timeout_s=60)
        run.degraded["memory_context"] += body["degraded"]
        run.blocks[q.query_id] = body["context"]
        run.included[q.query_id] = {i for ids in body["included"].values() for i in ids}


def resolve(run: Run, engine) -> None:  # noqa: ANN001
    """Hit ids as turn keys: an episode is its turn, a fact or rule the turn it was learned from (first seen)."""
    with engine.connect() as conn:
        for table in ("facts", "rules"):
            for i, source in conn.execute(
                text(f"SELECT id::text, source_episode_id::text FROM {table} WHERE tenant_id = :t"), {"t": run.tenant}
            ):
                if source in run.keys:
                    run.derived[i] = run.keys[source]
    for qid, ids in run.ranked.items():
        keys = [run.keys.get(i) or run.derived.get(i) for i in ids]
        run.ranked[qid] = list(dict.fromkeys(k for k in keys if k is not None))


def baselines(run: Run, engine, queries: list[rm.Query]) -> tuple[dict, dict, dict]:  # noqa: ANN001
    """rank-bm25 and dense rankings over the same earlier turns, and rank-bm25's turns packed into BUDGET tokens."""
    from rank_bm25 import BM25Okapi

    turns = run.persona.turns
    tokens = [re.findall(r"\w+", t.content.lower()) for t in turns]
    ids = {key: i for i, key in run.keys.items()}
    with engine.connect() as conn:
        stored = {
            i: json.loads(v)
            for i, v in conn.execute(
                text("SELECT id::text, embedding::text FROM episodes WHERE tenant_id = :t"), {"t": run.tenant}
            )
        }
    embedder, counter = get_embedder(), get_token_counter()
    bm25, dense, packed = {}, {}, {}
    for q in queries:
        visible = [i for i, t in enumerate(turns) if t.key[0] < q.session and t.key in ids]
        scores = BM25Okapi([tokens[i] for i in visible]).get_scores(re.findall(r"\w+", q.text.lower()))
        order = [visible[i] for i in np.argsort(-scores, kind="stable")]
        bm25[q.query_id] = [turns[i].key for i in order[:20]]
        vectors = np.stack([np.asarray(stored[ids[turns[i].key]], dtype=np.float32) for i in visible])
        near = np.argsort(-(vectors @ embedder.embed_one(q.text)), kind="stable")[:20]
        dense[q.query_id] = [turns[visible[i]].key for i in near]
        packed[q.query_id] = _pack([turns[i].content for i in order[:60]], counter)
    return bm25, dense, packed


def _pack(contents: list[str], counter) -> str:  # noqa: ANN001
    """Whole turns in rank order while they fit in BUDGET tokens (a turn that does not fit is skipped)."""
    lines, used = [], 0
    for content, n in zip(contents, counter.count_many(contents)):
        if used + n + 1 <= BUDGET:
            lines.append(content)
            used += n + 1
    return "\n".join(lines)


def in_block(
    q: rm.Query, block: str, turns: dict[tuple[int, int], rm.Turn], derived: frozenset[tuple[int, int]] = frozenset()
) -> bool:
    """An evidence turn's first 60 characters are in the block, or (``derived``) a fact or rule learned from it."""
    folded = rm.fold(block)
    return any(rm.fold(turns[key].text)[:PREFIX] in folded or key in derived for key in q.evidence)


def report(runs: list[Run], engine, ingest_s: float | None, with_context: bool, locomo: bool) -> None:  # noqa: ANN001
    """The tables, one per split present (dev = personas 1-5, the tuning split; test = 6-10); LoCoMo's in one."""
    if locomo:
        print("\n=== LoCoMo (never tuned on) ===")
        _report(runs, engine, ingest_s, with_context, "LoCoMo samples")
        return
    for name in ("dev", "test"):
        mine = [r for r in runs if r.number in rm.split(name)]
        if mine:
            print(f"\n=== {name} split ({'tuned on' if name == 'dev' else 'held out'}) ===")
            _report(mine, engine, ingest_s, with_context, "RealMem personas")


def _report(runs: list[Run], engine, ingest_s: float | None, with_context: bool, title: str) -> None:  # noqa: ANN001
    per_query: dict[str, list] = {"memory_search (hybrid)": [], "rank-bm25": [], "dense (MiniLM)": []}
    blocks, packs = [], []
    for run in runs:
        asked = [q for q in run.persona.queries if q.query_id in run.ranked]
        bm25, dense, packed = baselines(run, engine, asked)
        turns = {t.key: t for t in run.persona.turns}
        for q in asked:
            for system, ranked in zip(per_query, (run.ranked[q.query_id], bm25[q.query_id], dense[q.query_id])):
                per_query[system].append((q, rm.score(q, ranked)))
            if with_context:
                learned = frozenset(run.derived[i] for i in run.included[q.query_id] if i in run.derived)
                blocks.append(in_block(q, run.blocks[q.query_id], turns, learned))
                packs.append(in_block(q, packed[q.query_id], turns))
    rows = rm.table(per_query)
    print(
        f"\n{title} {', '.join(str(r.number) for r in runs)}: {len(per_query['rank-bm25'])} queries, "
        f"{sum(len(r.keys) for r in runs)} episodes "
        + (
            "stored by an earlier run (--reuse)"
            if ingest_s is None
            else f"stored in {ingest_s:.0f} s (replay incl. applying)"
        )
    )
    print(f"{'system':<24}{'category':<22}{'n':>5}" + "".join(f"{m:>9}" for m in rm.METRICS))
    for system, category, n, m in rows:
        print(f"{system:<24}{category:<22}{n:>5}" + "".join(f"{m[k]:>9.3f}" for k in rm.METRICS))
    overall = {system: m for system, category, _, m in rows if category == "all"}
    mine, base = overall["memory_search (hybrid)"], overall["rank-bm25"]
    print("ratio to rank-bm25 (all): " + ", ".join(f"{k} {mine[k] / base[k]:.2f}x" for k in rm.METRICS if base[k]))
    degraded = sum((r.degraded for r in runs), Counter())
    print(
        "degraded answers (empty, counted as misses): "
        + ", ".join(f"{tool} {degraded[tool]}" for tool in ("memory_search", "memory_context")[: 1 + with_context])
    )
    if with_context:
        share, packed = sum(blocks) / len(blocks), sum(packs) / len(packs)
        print(
            f"evidence in the block at {BUDGET} tokens: memory_context {share:.3f}, rank-bm25 packed {packed:.3f} "
            f"({share / packed if packed else float('nan'):.2f}x)"
        )


def single_client(url: str, run: Run, *, rounds: int, front: psutil.Process) -> dict[str, tuple[list[float], float]]:
    """The persona's questions again (those asked, ``rounds`` times over), one client, idle stack: per tool
    (memory_search, then memory_context over the whole replay), the latencies through MCP and the front's CPU
    milliseconds per call."""

    def arguments(tool: str, q: rm.Query) -> dict:
        if tool == "memory_search":
            return _search_arguments(q, _until(run.persona, q), ["episode"])
        return _context_arguments(q)

    async def go(tool: str) -> tuple[list[float], float]:
        out = []
        async with open_session(url, run.token, timeout_s=60) as session:
            cpu = sum(front.cpu_times()[:2])
            for q in (q for _ in range(rounds) for q in run.persona.queries if q.query_id in run.ranked):
                t0 = time.perf_counter()
                await call_tool(session, tool, arguments(tool, q), timeout_s=60)
                out.append(time.perf_counter() - t0)
            cpu = sum(front.cpu_times()[:2]) - cpu
        return out, 1000 * cpu / max(1, len(out))

    # This process holds every persona's turns and the baselines' indexes: out of its collector's sight, so a full
    # collection here (100+ ms) is not timed as a search.
    heap.settle()
    return {tool: asyncio.run(go(tool)) for tool in ("memory_search", "memory_context")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--split",
        choices=("dev", "test", "all"),
        default="dev",
        help="dev = personas 1-5 (tune here), test = 6-10 (report)",
    )
    parser.add_argument("--personas", help="comma-separated persona numbers (1-10), instead of --split")
    parser.add_argument(
        "--locomo",
        metavar="FILE",
        help="replay LoCoMo's conversations from FILE (its data/locomo10.json; not shipped: CC BY-NC) instead of "
        "RealMem; --personas then picks samples (1-based); questions are asked after each conversation's last session",
    )
    parser.add_argument("--limit", type=int, help="at most this many queries per persona (a quick run)")
    parser.add_argument("--workers", type=int, default=2, help="celery worker processes applying the episodes")
    parser.add_argument("--no-context", action="store_true", help="skip memory_context (search only)")
    parser.add_argument(
        "--consolidate",
        action="store_true",
        help="consolidation on; search facts, rules and episodes (a fact counts as its source turn)",
    )
    parser.add_argument("--database-url", help="a database to use (default: a throwaway one on the embedded server)")
    parser.add_argument("--redis-url", default=BENCH_REDIS_URL, help="flushed before and after")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="with --database-url of an earlier run: store nothing, ask the searches again (minutes, not half an "
        "hour; implies --no-context); e.g. to compare retrieval settings given as "
        "MEMORY_BUTLER_MEMORY__RETRIEVAL__<NAME> variables",
    )
    args = parser.parse_args()
    if args.reuse and not args.database_url:
        parser.error("--reuse needs --database-url (the database an earlier run filled)")
    # memory_context has no time bound: over the kept replay it would see the question's own and later sessions
    args.no_context = args.no_context or args.reuse
    samples = rm.locomo_samples(args.locomo) if args.locomo else []
    if args.personas:
        numbers = [int(n) for n in args.personas.split(",")]
    else:
        numbers = list(range(1, len(samples) + 1)) if args.locomo else rm.split(args.split)
    print(reference_line())
    with bench_redis(args.redis_url), bench_engine(args.database_url) as engine:
        runs = []
        with engine.begin() as conn:
            for n in numbers:
                tenant = f"locomo-{n}" if args.locomo else f"realmem-{n}"
                ensure_tenant(conn, tenant_id=tenant)
                token = create_token(conn, tenant_id=tenant, name="bench", butlers=[BUTLER], role="butler")[1]
                persona = rm.load_locomo(samples[n - 1]) if args.locomo else rm.load(n)
                runs.append(Run(n, persona, token, tenant))
        url_db = engine.url.render_as_string(hide_password=False)
        os.environ["MEMORY_BUTLER_CONSOLIDATION__AFTER_APPLY"] = "true" if args.consolidate else "false"
        # No reuse of a query's embedding: every timed search embeds its question (one the front has not seen).
        os.environ["MEMORY_BUTLER_EMBEDDING__QUERY_CACHE_TTL_S"] = "0"
        if args.consolidate:
            TYPES[:] = ["fact", "rule", "episode"]
        port = free_port()
        front = start_front(url_db, args.redis_url, port)
        workers = [] if args.reuse else start_workers(args.workers, url_db, args.redis_url, 8)
        url = f"http://127.0.0.1:{port}/mcp"
        try:
            from memory_workers import app as worker_app

            settings = load_settings(redis_url=args.redis_url, database_url=url_db)
            worker_app.configure(worker_app.app, settings)
            if not args.reuse:
                wait_ready(worker_app.app, args.workers)
            t0 = time.perf_counter()
            rewake = None if args.reuse else functools.partial(_rewake, settings)
            asyncio.run(_all(runs, url, engine, args.limit, not args.no_context, rewake))
            ingest_s = None if args.reuse else time.perf_counter() - t0
            largest = max(runs, key=lambda r: len(r.persona.turns))
            timed = single_client(url, largest, rounds=LATENCY_ROUNDS, front=psutil.Process(front.pid))
        finally:
            for proc in (front, *workers):
                os.killpg(proc.pid, signal.SIGTERM)
            for proc in (front, *workers):
                proc.wait(timeout=60)
        for run in runs:
            resolve(run, engine)
        if args.consolidate:
            _learned(runs, engine)
        report(runs, engine, ingest_s, not args.no_context, bool(args.locomo))
        searches, blocks = timed["memory_search"][0], timed["memory_context"][0]
        print(
            f"memory_search via MCP, one client, persona {largest.number} ({len(largest.keys)} episodes, "
            f"{len(searches)} searches): p50 {pct(searches, 50):.1f} ms, p95 {pct(searches, 95):.1f} ms"
        )
        print(
            f"memory_context via MCP, one client, the same questions (token_budget {BUDGET}, every session visible, "
            f"{len(blocks)} blocks): p50 {pct(blocks, 50):.1f} ms, p95 {pct(blocks, 95):.1f} ms"
        )
        print(
            "front CPU per call in these passes (each question embedded anew): "
            + ", ".join(f"{tool} {cpu:.2f} ms" for tool, (_, cpu) in timed.items())
        )
    return 0


async def _all(
    runs: list[Run],
    url: str,
    engine,
    limit: int | None,
    with_context: bool,  # noqa: ANN001
    rewake,
) -> None:  # noqa: ANN001
    await asyncio.gather(*(replay(run, url, engine, limit, with_context, rewake) for run in runs))


def _learned(runs: list[Run], engine) -> None:  # noqa: ANN001
    """What consolidation learned per persona."""
    for run in runs:
        with engine.connect() as conn:
            facts, rules = (
                conn.execute(text(f"SELECT count(*) FROM {t} WHERE tenant_id = :t"), {"t": run.tenant}).scalar()
                for t in ("facts", "rules")
            )
        print(f"persona {run.number}: {len(run.keys)} episodes -> {facts} facts, {rules} rules")


def _rewake(settings, tenant: str) -> None:  # noqa: ANN001
    from memory_workers.enqueue import wake_apply, wake_consolidate

    wake_apply(tenant, BUTLER, settings=settings)
    if len(TYPES) > 1:
        wake_consolidate(tenant, BUTLER, settings=settings)


if __name__ == "__main__":
    run_benchmark(main)
