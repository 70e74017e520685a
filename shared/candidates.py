"""Read-side candidates, in one statement per read: for every kind asked, the nearest rows by cosine (an exact
sort over a small scope, the HNSW index over a large one) and the best keyword rows (full text, any term, rarer
terms weigh more).

Every list is bounded by tenant, by the caller's scopes (facts/rules) or butlers (episodes), and by lifecycle state.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection, TextClause, text

from shared import telemetry
from shared.db import BINARY_RESULTS
from shared.scoring import effective_confidence_sql

TABLES = {"episode": "episodes", "fact": "facts", "rule": "rules"}
# A caller's butlers, on the rows of alias {a}: episodes, and the other vectors and postings, which carry their
# episode's butler.
_BY_BUTLER = "{a}.butler = ANY(:butlers)"


def _bounds_butlers(where: str, alias: str = "x") -> bool:
    """``where`` (of :func:`_where_sql`) keeps only the caller's butlers' rows of alias ``alias``."""
    return _BY_BUTLER.format(a=alias) in where


# Columns every hit needs for scoring; type-specific ones are NULL for the others.
_SHARED = "x.id, x.content, x.content_tokens, x.created_at, x.importance, x.last_referenced_at, "
COLUMNS = {
    "episode": _SHARED
    + (
        "x.session_id, x.occurred_at, NULL::text AS scope, x.butler, NULL::text AS subject, NULL::text AS predicate, "
        "NULL::text AS permanence, NULL::text AS validity, NULL::text AS maturity, "
        "NULL::float8 AS confidence, NULL::float8 AS decay_rate, "
        "NULL::timestamptz AS last_confirmed_at, NULL::float8 AS effectiveness_score"
    ),
    "fact": _SHARED
    + (
        "NULL::uuid AS session_id, NULL::timestamptz AS occurred_at, x.scope, NULL::text AS butler, x.subject, x.predicate, x.permanence, x.validity, "
        "NULL::text AS maturity, x.confidence, x.decay_rate, x.last_confirmed_at, "
        "NULL::float8 AS effectiveness_score"
    ),
    "rule": _SHARED
    + (
        "NULL::uuid AS session_id, NULL::timestamptz AS occurred_at, x.scope, NULL::text AS butler, NULL::text AS subject, NULL::text AS predicate, x.permanence, "
        "x.validity, x.maturity, x.confidence, x.decay_rate, x.last_confirmed_at, "
        "x.effectiveness_score"
    ),
}

# An OR over the query's own lexemes: websearch_to_tsquery would require every term.
KEYWORD_CTE = """
lex AS MATERIALIZED (SELECT DISTINCT lexeme FROM unnest(to_tsvector('english', :query)) AS t),
q AS MATERIALIZED (SELECT to_tsquery('simple', string_agg(quote_literal(lexeme), ' | ')) AS tsq FROM lex),
la AS MATERIALIZED (SELECT coalesce(array_agg(lexeme), '{}') AS a FROM lex)
"""


@dataclass(frozen=True)
class Filter:
    """Which rows a read may see."""

    tenant_id: str
    scopes: tuple[str, ...] | None  # facts/rules; None = every scope (admin)
    butlers: tuple[str, ...] | None  # episodes; None = every butler (admin)
    min_confidence: float | None  # facts/rules: effective confidence floor; None = no floor
    now: datetime
    since: datetime | None = None  # episodes: occurred_at >= since
    until: datetime | None = None  # episodes: occurred_at < until


def _where(kind: str, f: Filter, params: dict[str, Any]) -> str:
    """The rows ``f`` lets a read see: adds their values to ``params`` and returns the clause (which depends
    only on the filter's shape, see :func:`_where_sql`)."""
    params.update(tenant_id=f.tenant_id, now=f.now)
    if f.butlers is not None:
        params["butlers"] = list(f.butlers)
    if f.scopes is not None:
        params["scopes"] = list(f.scopes)
    if _floor(f):
        params["min_confidence"] = f.min_confidence
    bounds = (kind == "episode" and f.since is not None, kind == "episode" and f.until is not None)
    params.update(
        {name: value for name, value, on in (("since", f.since, bounds[0]), ("until", f.until, bounds[1])) if on}
    )
    return _where_sql(kind, f.scopes is not None, f.butlers is not None, _floor(f), *bounds)


def _floor(f: Filter) -> bool:
    return f.min_confidence is not None and f.min_confidence > 0


@lru_cache(maxsize=64)
def _where_sql(
    kind: str, by_scope: bool, by_butler: bool, floor: bool, since: bool = False, until: bool = False
) -> str:
    clauses = ["x.tenant_id = :tenant_id"]
    if kind == "episode":
        clauses += ["x.forgotten_at IS NULL", "x.expires_at > :now"]
        if by_butler:
            clauses.append(_BY_BUTLER.format(a="x"))
        clauses += ["x.occurred_at >= :since"] * since + ["x.occurred_at < :until"] * until
        return " AND ".join(clauses)
    clauses.append("x.validity IN ('active', 'fading')")
    if by_scope:
        clauses.append("x.scope = ANY(:scopes)")
    if floor:
        clauses.append(f"{effective_confidence_sql('x')} >= :min_confidence")
    return " AND ".join(clauses)


def read_settings(*, pool: int, timeout_ms: int, generic_plans: bool = False) -> str:
    """Session settings for one read transaction, sent as one statement (fewer round trips per read).

    A tenant-filtered HNSW scan finds too few rows unless it may keep scanning (iterative scan) with an
    ef_search of at least the candidates fetched. No parallel workers: starting them costs more than a read of a
    few milliseconds saves (measured: a generic plan's parallel scan of a six-butler tenant's episode vectors,
    77 ms). ``generic_plans`` lets the driver's prepared statements skip planning: right for :func:`gather`, whose
    plan is fixed by its shape (the scope size picks the shape, not the planner), measured 1.5 ms less per
    statement; not for ad-hoc reads whose best plan depends on the values (they say so, in case their connection's
    session prefers generic plans: :func:`retrieval_session`).
    """
    return (
        f"SET TRANSACTION READ ONLY; SET LOCAL statement_timeout = {int(timeout_ms)}; "
        f"SET LOCAL hnsw.ef_search = {_ef_search(pool)}; "
        "SET LOCAL hnsw.iterative_scan = relaxed_order; SET LOCAL max_parallel_workers_per_gather = 0; "
        f"SET LOCAL plan_cache_mode = {'force_generic_plan' if generic_plans else 'auto'}"
    )


def retrieval_session(*, pool: int, timeout_ms: int) -> str:
    """The same settings for the whole session of a connection that serves only reads (the front's read pools):
    its retrieval reads then need no transaction - one statement, one round trip, instead of BEGIN and the
    settings, the statement, COMMIT. Every other read on such a connection opens a transaction and sets its own
    (``read_settings``, the dashboard's read_transaction), which override these for that transaction."""
    return (
        f"SET statement_timeout = {int(timeout_ms)}; SET hnsw.ef_search = {_ef_search(pool)}; "
        "SET hnsw.iterative_scan = relaxed_order; SET max_parallel_workers_per_gather = 0; "
        "SET plan_cache_mode = force_generic_plan"
    )


def _ef_search(pool: int) -> int:
    return max(40, min(int(pool), 1000))


VISIBLE_TTL_S = 30.0
_visible_cache: dict[tuple[str, str, tuple[str, ...] | None, tuple[str, ...] | None], tuple[int, float, float]] = {}
# Visible rows up to which a keyword match is tested on the caller's rows rather than by a table-wide GIN scan
# (measured: 26 ms vs 2 ms at 100k facts for a 1k-row tenant).
SMALL_SCOPE = 20_000
# Visible rows up to which the nearest rows are found by an exact sort of the caller's rows, read once for both
# lists; above it the HNSW index (iterative scan) is faster.
EXACT_SCOPE = 5_000


@dataclass(frozen=True)
class Bm25:
    """The keyword leg's BM25 constants: ``k1`` (term-frequency saturation), ``b`` (length normalisation) and
    ``context_weight`` (what a term in an episode's preceding turn counts for, against 1 in its own text)."""

    k1: float = 0.6
    b: float = 0.3
    context_weight: float = 0.3


def gather(
    conn: Connection,
    *,
    kinds: Sequence[str],
    f: Filter,
    query: str,
    query_vec: str | None,
    pool: int,
    keyword: bool = True,
    cap: int = 5000,
    bm25: Bm25 = Bm25(),
    recent: int = 0,
) -> dict[str, list[dict[str, Any]]]:
    """Every kind's candidates in one statement (one round trip, one plan): the ``pool`` nearest rows by cosine
    (if ``query_vec``) and the ``pool`` best rows by BM25 (if ``keyword``), each row once, each scored on both legs.
    With ``recent`` (kinds holding "episode"), the same statement also returns the ``recent`` newest episodes the
    caller may see under ``"recent"`` (newest first, neither leg scored): memory_context's conversation so far.

    A row carries ``semantic`` (cosine similarity clamped to [0, 1]; an episode is as near as its nearest vector:
    itself, itself after its preceding turn, or a window of it) and ``keyword`` (its BM25 score over the query's
    idf total, in [0, 1] but for repeated terms: 1.0 is every term once at average length); None where that leg
    did not run. Run it inside a transaction that applied :func:`read_settings`.
    """
    out: dict[str, list[dict[str, Any]]] = {kind: [] for kind in (*kinds, *(["recent"] if recent else []))}
    if query_vec is None and not keyword:
        return out
    statement = prepare(
        conn,
        kinds=kinds,
        f=f,
        query=query,
        query_vec=query_vec,
        pool=pool,
        keyword=keyword,
        cap=cap,
        bm25=bm25,
        recent=recent,
    )
    started = time.perf_counter()
    result = conn.execute(*statement)
    mode = "keyword" if query_vec is None else "hybrid" if keyword else "semantic"
    telemetry.CANDIDATE_SECONDS.labels(mode).observe(time.perf_counter() - started)
    names = list(result.keys())
    for values in result.all():
        row = dict(zip(names, values))
        out[row["kind"]].append(row)
    return out


def prepare(
    conn: Connection,
    *,
    kinds: Sequence[str],
    f: Filter,
    query: str,
    query_vec: str | None,
    pool: int,
    keyword: bool = True,
    cap: int = 5000,
    bm25: Bm25 = Bm25(),
    recent: int = 0,
) -> tuple[TextClause, dict[str, Any]]:
    """:func:`gather`'s statement and parameters (the scope sizes it needs come from a cached count)."""
    if recent and "episode" not in kinds:
        raise ValueError("recent episodes come with the episode candidates")
    params: dict[str, Any] = {
        "query": query,
        "vec": query_vec,
        "pool": pool,
        "cap": cap,
        "k1": bm25.k1,
        "b": bm25.b,
        "ctx_weight": bm25.context_weight,
        "recent": recent,
    }
    shapes = []
    for kind in kinds:
        where = _where(kind, f, params)
        visible, params[f"avgdl_{kind}"] = _visible_rows(conn, kind=kind, f=f, limit=SMALL_SCOPE)
        params[f"n_{kind}"] = float(visible)
        shapes.append((kind, where, visible < EXACT_SCOPE, visible < SMALL_SCOPE))
    return _statement(tuple(shapes), semantic=query_vec is not None, keyword=keyword, recent=recent > 0), params


@lru_cache(maxsize=256)
def _statement(
    shapes: tuple[tuple[str, str, bool, bool], ...], *, semantic: bool, keyword: bool, recent: bool = False
) -> TextClause:
    """The gather statement for (kind, where clause, exact, scoped) per kind: its text depends only on these, so it
    is built once per process and the driver prepares it once per connection."""
    ctes = [KEYWORD_CTE] if keyword else []
    selects = []
    for kind, where, small, scoped in shapes:
        table = TABLES[kind]
        exact = semantic and small
        if scoped:
            # The caller's rows, read once: their distance (small scopes), their terms and their length.
            cols = ["x.id", "x.ctid AS tid", "x.created_at"]
            # (An episode's terms are read from its postings, not its tsvectors.)
            cols += (
                (
                    [_LENGTH]
                    if kind == "episode"
                    else ["x.search_vector", f"{_CONTEXT[kind]} AS context_vector", _LENGTH]
                )
                if keyword
                else []
            )
            # Every embedding is L2-normalised, so cosine distance is 1 - inner product; the inner product skips
            # the two norms (measured: 0.75 -> 0.38 ms per 700 rows). The HNSW path keeps <=>, its index's operator.
            cols += ["1 + (x.embedding <#> CAST(:vec AS vector)) AS d"] if exact else []
            ctes.append(f"scoped_{kind} AS MATERIALIZED ({_per_butler(', '.join(cols), table, where)})")
        # The rows of both lists, each once, with its BM25 score whichever list found it: every row holding a query
        # term is in bm_{kind}, so its score is carried through one aggregate (a join to bm_{kind} would be a
        # nested loop over it per row: the planner cannot know how few rows the lists hold).
        lists = []
        if semantic:
            ctes.append(f"sem_{kind} AS MATERIALIZED ({_nearest(kind, table, where, exact)})")
            lists.append(f"SELECT id, tid, created_at, NULL::float8 AS bm25, true AS listed FROM sem_{kind}")
        if keyword:
            ctes.append(_keyword_ctes(kind=kind, table=table, where=where, scoped=scoped))
            lists.append(f"SELECT id, tid, created_at, NULL::float8 AS bm25, true AS listed FROM key_{kind}")
            lists.append(f"SELECT id, tid, created_at, bm25, false AS listed FROM bm_{kind}")
        ctes.append(
            f"ids_{kind} AS (SELECT id, tid, created_at, max(bm25) AS bm25 FROM ({' UNION ALL '.join(lists)}) u "
            "GROUP BY id, tid, created_at HAVING bool_or(listed))"
        )
        # Back to the row by its tuple id, which every list carries: the statement's one snapshot keeps the
        # version it saw, and a TID fetch skips the primary-key descent (measured: 0.6-0.75 ms less per gather).
        # A tuple id is unique within one partition only: an episode's accept time names its month (run-time
        # partition pruning), so each fetch reads one partition and can match no other month's row.
        # Both legs are scored for every row, whichever list found it (the rows are in hand: cheap).
        sem = f"greatest(0, 1 - {_distance(kind, 'x')})" if semantic else "NULL::float8"
        key = f"coalesce(i.bm25, 0) / nullif((SELECT sum(w) FROM idf_{kind}), 0)" if keyword else "NULL::float8"
        selects.append(
            f"SELECT '{kind}' AS kind, {COLUMNS[kind]}, {sem} AS semantic, {key} AS keyword "
            f"FROM ids_{kind} i JOIN {table} x ON x.ctid = i.tid{_SAME_MONTH[kind]}"
        )
        if recent and kind == "episode":
            selects.append(
                f"(SELECT 'recent' AS kind, {COLUMNS[kind]}, NULL::float8 AS semantic, NULL::float8 AS keyword "
                f"FROM episodes x WHERE {where} ORDER BY x.occurred_at DESC, x.seq DESC, x.id ASC LIMIT :recent)"
            )
    # Every column is a built-in type: its rows come in the binary format (shared.db.BINARY_RESULTS).
    return text("WITH " + ",\n".join(ctes) + "\n" + "\nUNION ALL\n".join(selects)).execution_options(
        **{BINARY_RESULTS: True}
    )


# episodes are partitioned by month of created_at (0018): a tuple id is only unique with its month.
_SAME_MONTH = {"episode": " AND x.created_at = i.created_at", "fact": "", "rule": ""}
# An episode's preceding turn(s) are a second keyword field; facts and rules have none.
_CONTEXT = {"episode": "x.context_vector", "fact": "''::tsvector", "rule": "''::tsvector"}
# BM25's document length: the content's word pieces, stored at write time (NULL for rows written before).
_LENGTH = "coalesce(x.content_tokens, 16)::float8 AS dl"
# An episode's other vectors (itself after its preceding turn; windows of a long one): the nearest counts.
_VIEWS = "(SELECT min(v.embedding <=> CAST(:vec AS vector)) FROM episode_vectors v WHERE v.episode_id = {a}.id)"


def _per_butler(cols: str, table: str, where: str, alias: str = "x") -> str:
    """``SELECT {cols} FROM {table} {alias} WHERE {where}``, read one butler at a time when ``where`` bounds the
    caller's butlers.

    The statement runs on a generic plan, which cannot know how few of the tenant's rows ``butler = ANY(...)``
    keeps: on a tenant of several butlers it scans the whole month (or every vector) instead of the butler index
    (measured, six butlers: 16-19 ms for the month, 64 ms for the vectors). Per butler (a lateral subquery that is
    not flattened: OFFSET 0), the butler is an equality on the index's second column, and the plan takes the
    index when it keeps a small part of the tenant."""
    if not _bounds_butlers(where, alias):
        return f"SELECT {cols} FROM {table} {alias} WHERE {where}"
    return (
        "SELECT r.* FROM (SELECT DISTINCT unnest(CAST(:butlers AS text[])) AS butler) b "
        f"CROSS JOIN LATERAL (SELECT {cols} FROM {table} {alias} WHERE {where} AND {alias}.butler = b.butler "
        "OFFSET 0) r"
    )


def _distance(kind: str, alias: str) -> str:
    own = f"({alias}.embedding <=> CAST(:vec AS vector))"
    return f"least({own}, {_VIEWS.format(a=alias)})" if kind == "episode" else own


def _nearest(kind: str, table: str, where: str, exact: bool) -> str:
    """The ``pool`` nearest rows (id, tid, created_at): an exact sort of the caller's rows, or the HNSW index
    (iterative scan for the filter); an episode also by its other vectors."""
    if exact and kind != "episode":
        return "SELECT id, tid, created_at FROM scoped_{k} ORDER BY d LIMIT :pool".format(k=kind)
    # Only the caller's butlers' vectors: another butler's are never candidates (a tenant of many butlers would
    # otherwise pay for all of theirs, and fill the index path's pool with rows the filter then drops).
    mine = "v.tenant_id = :tenant_id" + (f" AND {_BY_BUTLER.format(a='v')}" if _bounds_butlers(where) else "")
    if exact:
        vectors = _per_butler("v.episode_id, v.embedding", "episode_vectors", mine, alias="v")
        return (
            "SELECT s.id, s.tid, s.created_at FROM scoped_episode s LEFT JOIN (SELECT v.episode_id AS id, "
            f"min(1 + (v.embedding <#> CAST(:vec AS vector))) AS d FROM ({vectors}) v GROUP BY v.episode_id) v "
            "ON v.id = s.id ORDER BY least(s.d, coalesce(v.d, 2)) LIMIT :pool"
        )
    # ORDER BY the selected distance: the HNSW index can serve it (iterative scan for the filter).
    own = (
        f"SELECT x.id, x.ctid AS tid, x.created_at, x.embedding <=> CAST(:vec AS vector) AS d FROM {table} x "
        f"WHERE {where} ORDER BY d LIMIT :pool"
    )
    if kind != "episode":
        return own
    views = (
        "SELECT v.episode_id AS id, v.embedding <=> CAST(:vec AS vector) AS d FROM episode_vectors v "
        f"WHERE {mine} ORDER BY d LIMIT :pool"
    )
    return (
        f"SELECT id, tid, created_at FROM (SELECT id, tid, created_at, min(d) AS d FROM (({own}) UNION ALL "
        f"(SELECT x.id, x.ctid AS tid, x.created_at, v.d FROM ({views}) v JOIN episodes x ON x.id = v.id "
        f"WHERE {where})) u GROUP BY id, tid, created_at ORDER BY d LIMIT :pool) n"
    )


# A query lexeme's idf over the caller's N visible rows, its document frequency counted from tf_{kind}.
_IDF = """
    SELECT l.lexeme, ln(1 + (greatest({n}, coalesce(d.n, 0)) - coalesce(d.n, 0) + 0.5) / (coalesce(d.n, 0) + 0.5)) AS w
    FROM lex l LEFT JOIN (SELECT lexeme, count(*)::float8 AS n FROM tf_{kind} GROUP BY lexeme) d USING (lexeme)"""


def _keyword_ctes(*, kind: str, table: str, where: str, scoped: bool) -> str:
    """CTEs ending in ``bm_{kind}(id, bm25)`` (every row holding a query term) and ``key_{kind}(id, tid)`` (the
    ``pool`` best): Okapi BM25 with idf over the caller's visible rows, stemmed lexemes (the ``english``
    configuration for query and rows alike), length from the content's word pieces.

    A term's frequency is read from the row's positions of the query's lexemes only (``setweight`` marks them,
    ``ts_filter`` keeps them: measured 10 ms vs 27 ms for unnesting whole vectors at 1.4k rows); in an episode's
    preceding turn it counts ``ctx_weight`` times."""
    if scoped and kind == "episode":
        return _episode_postings_ctes(mine=_bounds_butlers(where))
    if scoped:
        cand = (
            f"cand_{kind} AS MATERIALIZED (SELECT s.id, s.tid, s.created_at, s.search_vector, s.context_vector, "
            f"s.dl FROM scoped_{kind} s, q WHERE q.tsq IS NOT NULL "
            f"AND (s.search_vector @@ q.tsq OR s.context_vector @@ q.tsq) LIMIT :cap)"
        )
        avgdl = f"(SELECT avg(dl) FROM scoped_{kind})"
        n = f"(SELECT count(*)::float8 FROM scoped_{kind})"  # exact, and bounded in time as the read is
    else:
        cand = (
            f"cand_{kind} AS MATERIALIZED (SELECT x.id, x.ctid AS tid, x.created_at, x.search_vector, "
            f"{_CONTEXT[kind]} AS context_vector, {_LENGTH} FROM {table} x, q WHERE q.tsq IS NOT NULL "
            f"AND x.search_vector @@ q.tsq AND {where} LIMIT :cap)"
        )
        avgdl = f":avgdl_{kind}"
        n = f":n_{kind}"
    return f"""{cand},
tf_{kind} AS MATERIALIZED (
    SELECT c.id, u.lexeme, sum(u.n) AS tf FROM cand_{kind} c, la, LATERAL (
        SELECT t.lexeme, cardinality(t.positions)::float8 AS n
        FROM unnest(ts_filter(setweight(c.search_vector, 'A', la.a), '{{a}}')) t
        UNION ALL
        SELECT t.lexeme, :ctx_weight * cardinality(t.positions) FROM unnest(ts_filter(setweight(c.context_vector, 'A', la.a), '{{a}}')) t
    ) u GROUP BY c.id, u.lexeme),
idf_{kind} AS MATERIALIZED ({_IDF.format(kind=kind, n=n)}),
bm_{kind} AS MATERIALIZED (
    SELECT t.id, c.tid, c.created_at,
           sum(i.w * t.tf * (:k1 + 1) / (t.tf + :k1 * (1 - :b + :b * c.dl / {avgdl}))) AS bm25
    FROM tf_{kind} t JOIN idf_{kind} i USING (lexeme) JOIN cand_{kind} c ON c.id = t.id
    GROUP BY t.id, c.tid, c.created_at),
key_{kind} AS (SELECT id, tid, created_at FROM bm_{kind} ORDER BY bm25 DESC, created_at DESC, id ASC LIMIT :pool)"""


def _episode_postings_ctes(*, mine: bool) -> str:
    """The keyword leg of :func:`_keyword_ctes` for the caller's episodes, from their term postings
    (``episode_terms``, kept by the database): an index lookup per query lexeme instead of reading every matching
    row's tsvectors (measured on a 1,800-turn tenant: ~65 % of the turns hold one of a long query's lexemes).
    ``mine``: the caller's butlers' postings only (keyed by butler, migration 0019). A posting carries its row's
    tuple id and length from the one join that keeps it visible, so the score needs no second join to the rows
    (measured on a 1,800-turn tenant's 82 questions: p95 22-24 -> 19-20 ms, the same rows and scores)."""
    butlers = f" AND {_BY_BUTLER.format(a='t')}" if mine else ""
    return f"""tf_episode AS MATERIALIZED (
    SELECT t.episode_id AS id, s.tid, s.created_at, s.dl, t.lexeme, t.tf + :ctx_weight * t.ctf AS tf
    FROM lex l JOIN episode_terms t ON t.tenant_id = :tenant_id{butlers} AND t.lexeme = l.lexeme
    JOIN scoped_episode s ON s.id = t.episode_id),
idf_episode AS MATERIALIZED ({_IDF.format(kind="episode", n="(SELECT count(*)::float8 FROM scoped_episode)")}),
bm_episode AS MATERIALIZED (
    SELECT t.id, t.tid, t.created_at, sum(i.w * t.tf * (:k1 + 1) / (t.tf + :k1 * (1 - :b + :b * t.dl /
           (SELECT avg(dl) FROM scoped_episode)))) AS bm25
    FROM tf_episode t JOIN idf_episode i USING (lexeme)
    GROUP BY t.id, t.tid, t.created_at),
key_episode AS (SELECT id, tid, created_at FROM bm_episode ORDER BY bm25 DESC, created_at DESC, id ASC LIMIT :pool)"""


def _visible_rows(conn: Connection, *, kind: str, f: Filter, limit: int) -> tuple[int, float]:
    """How many rows the caller may see, counted up to ``limit`` (the N of the idf; capped for huge scopes), and
    their mean length in word pieces (BM25's average document length on the index paths).

    Cached per process for VISIBLE_TTL_S: it only picks a plan shape and scales BM25, and scopes grow slowly.
    """
    key = (kind, f.tenant_id, f.scopes, f.butlers)
    hit = _visible_cache.get(key)
    now = time.monotonic()
    if hit is not None and now - hit[2] < VISIBLE_TTL_S:
        return hit[0], hit[1]
    params: dict[str, Any] = {"limit": limit}
    where = _where(kind, Filter(f.tenant_id, f.scopes, f.butlers, None, f.now), params)  # unbounded in time
    row = conn.execute(
        text(
            f"SELECT count(*), coalesce(avg(dl), 16) FROM (SELECT {_LENGTH} FROM {TABLES[kind]} x WHERE {where} "
            "LIMIT :limit) s"
        ),
        params,
    ).one()
    count: int = row[0]
    avgdl = float(row[1])
    if len(_visible_cache) > 50_000:
        _visible_cache.clear()
    _visible_cache[key] = (count, avgdl, now)
    return count, avgdl
