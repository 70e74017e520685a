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

from shared.scoring import effective_confidence_sql

TABLES = {"episode": "episodes", "fact": "facts", "rule": "rules"}

# Columns every hit needs for scoring; type-specific ones are NULL for the others.
_SHARED = "x.id, x.content, x.content_tokens, x.created_at, x.importance, x.last_referenced_at, "
COLUMNS = {
    "episode": _SHARED + ("NULL::text AS scope, x.butler, NULL::text AS subject, NULL::text AS predicate, "
                          "NULL::text AS permanence, NULL::text AS validity, NULL::text AS maturity, "
                          "NULL::float8 AS confidence, NULL::float8 AS decay_rate, "
                          "NULL::timestamptz AS last_confirmed_at, NULL::float8 AS effectiveness_score"),
    "fact": _SHARED + ("x.scope, NULL::text AS butler, x.subject, x.predicate, x.permanence, x.validity, "
                       "NULL::text AS maturity, x.confidence, x.decay_rate, x.last_confirmed_at, "
                       "NULL::float8 AS effectiveness_score"),
    "rule": _SHARED + ("x.scope, NULL::text AS butler, NULL::text AS subject, NULL::text AS predicate, x.permanence, "
                       "x.validity, x.maturity, x.confidence, x.decay_rate, x.last_confirmed_at, "
                       "x.effectiveness_score"),
}

# An OR over the query's own lexemes: websearch_to_tsquery would require every term.
KEYWORD_CTE = """
lex AS MATERIALIZED (SELECT lexeme, to_tsquery('simple', quote_literal(lexeme)) AS lq
                     FROM (SELECT DISTINCT lexeme FROM unnest(to_tsvector('english', :query)) AS t) d),
q AS MATERIALIZED (SELECT to_tsquery('simple', string_agg(quote_literal(lexeme), ' | ')) AS tsq FROM lex)
"""


@dataclass(frozen=True)
class Filter:
    """Which rows a read may see."""

    tenant_id: str
    scopes: tuple[str, ...] | None      # facts/rules; None = every scope (admin)
    butlers: tuple[str, ...] | None     # episodes; None = every butler (admin)
    min_confidence: float | None        # facts/rules: effective confidence floor; None = no floor
    now: datetime


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
    return _where_sql(kind, f.scopes is not None, f.butlers is not None, _floor(f))


def _floor(f: Filter) -> bool:
    return f.min_confidence is not None and f.min_confidence > 0


@lru_cache(maxsize=64)
def _where_sql(kind: str, by_scope: bool, by_butler: bool, floor: bool) -> str:
    clauses = ["x.tenant_id = :tenant_id"]
    if kind == "episode":
        clauses += ["x.forgotten_at IS NULL", "x.expires_at > :now"]
        if by_butler:
            clauses.append("x.butler = ANY(:butlers)")
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
    ef_search of at least the candidates fetched. ``generic_plans`` lets the driver's prepared statements skip
    planning: right for :func:`gather`, whose plan is fixed by its shape (the scope size picks the shape, not the
    planner), measured 1.5 ms less per statement; not for ad-hoc reads whose best plan depends on the values.
    """
    return (f"SET TRANSACTION READ ONLY; SET LOCAL statement_timeout = {int(timeout_ms)}; "
            f"SET LOCAL hnsw.ef_search = {max(40, min(int(pool), 1000))}; "
            "SET LOCAL hnsw.iterative_scan = relaxed_order"
            + ("; SET LOCAL plan_cache_mode = force_generic_plan" if generic_plans else ""))


VISIBLE_TTL_S = 30.0
_visible_cache: dict[tuple, tuple[int, float]] = {}
# Visible rows up to which a keyword match is tested on the caller's rows rather than by a table-wide GIN scan
# (measured: 26 ms vs 2 ms at 100k facts for a 1k-row tenant).
SMALL_SCOPE = 20_000
# Visible rows up to which the nearest rows are found by an exact sort of the caller's rows, read once for both
# lists; above it the HNSW index (iterative scan) is faster.
EXACT_SCOPE = 5_000


def gather(
    conn: Connection, *, kinds: Sequence[str], f: Filter, query: str, query_vec: str | None, pool: int,
    keyword: bool = True, cap: int = 5000,
) -> dict[str, list[dict[str, Any]]]:
    """Every kind's candidates in one statement (one round trip, one plan): the ``pool`` nearest rows by cosine
    (if ``query_vec``) and the ``pool`` best rows by keyword score (if ``keyword``), each row once.

    A row carries ``semantic`` (cosine similarity clamped to [0, 1]) and ``keyword`` (its share of the query's idf
    weight, in [0, 1]: 1.0 means every term is in the row); either is None where the row is not in that list.
    Run it inside a transaction that applied :func:`read_settings`.
    """
    out: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    if query_vec is None and not keyword:
        return out
    params: dict[str, Any] = {"query": query, "vec": query_vec, "pool": pool, "cap": cap}
    shapes = []
    for kind in kinds:
        where = _where(kind, f, params)
        visible = _visible_rows(conn, kind=kind, f=f, limit=SMALL_SCOPE)
        params[f"n_{kind}"] = float(visible)
        shapes.append((kind, where, visible < EXACT_SCOPE, visible < SMALL_SCOPE))
    result = conn.execute(_statement(tuple(shapes), semantic=query_vec is not None, keyword=keyword), params)
    names = list(result.keys())
    for values in result.all():
        row = dict(zip(names, values))
        out[row["kind"]].append(row)
    return out


@lru_cache(maxsize=256)
def _statement(shapes: tuple[tuple[str, str, bool, bool], ...], *, semantic: bool, keyword: bool) -> TextClause:
    """The gather statement for (kind, where clause, exact, scoped) per kind: its text depends only on these, so it
    is built once per process and the driver prepares it once per connection."""
    ctes = [KEYWORD_CTE] if keyword else []
    selects = []
    for kind, where, small, scoped in shapes:
        table = TABLES[kind]
        exact = semantic and small
        if scoped:
            # The caller's rows, read once: their distance (small scopes) and their terms.
            cols = ["x.id", "x.ctid AS tid", "x.created_at"] + (["x.search_vector"] if keyword else [])
            # Every embedding is L2-normalised, so cosine distance is 1 - inner product; the inner product skips
            # the two norms (measured: 0.75 -> 0.38 ms per 700 rows). The HNSW path keeps <=>, its index's operator.
            cols += ["1 + (x.embedding <#> CAST(:vec AS vector)) AS d"] if exact else []
            ctes.append(f"scoped_{kind} AS MATERIALIZED (SELECT {', '.join(cols)} FROM {table} x WHERE {where})")
        lists = []
        if semantic:
            source = (f"SELECT id, tid, d FROM scoped_{kind} ORDER BY d LIMIT :pool" if exact else
                      # ORDER BY the selected distance: the HNSW index can serve it (iterative scan for the filter).
                      f"SELECT x.id, x.ctid AS tid, x.embedding <=> CAST(:vec AS vector) AS d FROM {table} x "
                      f"WHERE {where} ORDER BY d LIMIT :pool")
            ctes.append(f"sem_{kind} AS MATERIALIZED ({source})")
            lists.append(f"SELECT id, tid, greatest(0, 1 - d) AS s, NULL::float8 AS k FROM sem_{kind}")
        if keyword:
            ctes.append(_keyword_ctes(kind=kind, table=table, where=where, scoped=scoped))
            lists.append(f"SELECT id, tid, NULL::float8 AS s, relevance AS k FROM key_{kind}")
        ctes.append(f"ids_{kind} AS (SELECT id, tid, max(s) AS s, max(k) AS k FROM ({' UNION ALL '.join(lists)}) u "
                    "GROUP BY id, tid)")
        # Back to the row by its tuple id, which every list carries: the statement's one snapshot keeps the
        # version it saw, and a TID fetch skips the primary-key descent (measured: 0.6-0.75 ms less per gather).
        selects.append(f"SELECT '{kind}' AS kind, {COLUMNS[kind]}, i.s AS semantic, i.k AS keyword "
                       f"FROM ids_{kind} i JOIN {table} x ON x.ctid = i.tid")
    return text("WITH " + ",\n".join(ctes) + "\n" + "\nUNION ALL\n".join(selects))


def _keyword_ctes(*, kind: str, table: str, where: str, scoped: bool) -> str:
    """CTEs ending in ``key_{kind}(id, tid, relevance)``: rows containing any query term, scored by the summed rarity
    (BM25 idf over the caller's visible rows) of the terms they contain, over the idf of all the query's terms.

    Each candidate is matched against each query term once (``hits_{kind}``: a row per candidate and term it
    contains); the document frequencies and the scores are both counted from those pairs."""
    if scoped:
        cand = (f"cand_{kind} AS MATERIALIZED (SELECT s.id, s.tid, s.created_at, s.search_vector "
                f"FROM scoped_{kind} s, q WHERE q.tsq IS NOT NULL AND s.search_vector @@ q.tsq LIMIT :cap)")
    else:
        cand = (f"cand_{kind} AS MATERIALIZED (SELECT x.id, x.ctid AS tid, x.created_at, x.search_vector "
                f"FROM {table} x, q WHERE q.tsq IS NOT NULL AND x.search_vector @@ q.tsq AND {where} LIMIT :cap)")
    return f"""{cand},
hits_{kind} AS MATERIALIZED (
    SELECT c.id, c.tid, c.created_at, l.lexeme FROM cand_{kind} c JOIN lex l ON c.search_vector @@ l.lq),
idf_{kind} AS MATERIALIZED (
    SELECT lexeme, ln(1 + (:n_{kind} - n + 0.5) / (n + 0.5)) AS w
    FROM (SELECT l.lexeme, count(h.id)::float8 AS n FROM lex l LEFT JOIN hits_{kind} h USING (lexeme)
          GROUP BY l.lexeme) d),
key_{kind} AS (SELECT h.id, h.tid, sum(i.w) / nullif((SELECT sum(w) FROM idf_{kind}), 0) AS relevance
         FROM hits_{kind} h JOIN idf_{kind} i USING (lexeme)
         GROUP BY h.id, h.tid, h.created_at
         ORDER BY relevance DESC, h.created_at DESC, h.id ASC LIMIT :pool)"""


def _visible_rows(conn: Connection, *, kind: str, f: Filter, limit: int) -> int:
    """How many rows the caller may see, counted up to ``limit`` (the N of the idf; capped for huge scopes).

    Cached per process for VISIBLE_TTL_S: it only picks a plan shape and scales idf, and scopes grow slowly.
    """
    key = (kind, f.tenant_id, f.scopes, f.butlers)
    hit = _visible_cache.get(key)
    now = time.monotonic()
    if hit is not None and now - hit[1] < VISIBLE_TTL_S:
        return hit[0]
    params: dict[str, Any] = {"limit": limit}
    where = _where(kind, Filter(f.tenant_id, f.scopes, f.butlers, None, f.now), params)
    count = conn.execute(text(f"SELECT count(*) FROM (SELECT 1 FROM {TABLES[kind]} x WHERE {where} LIMIT :limit) s"),
                         params).scalar_one()
    if len(_visible_cache) > 50_000:
        _visible_cache.clear()
    _visible_cache[key] = (count, now)
    return count


def recent_episodes(conn: Connection, *, f: Filter, limit: int) -> list[dict[str, Any]]:
    """The newest episodes the caller may see (for the context block's "Recent" section)."""
    params: dict[str, Any] = {"limit": limit}
    where = _where("episode", f, params)
    sql = (f"SELECT {COLUMNS['episode']}, 0.0::float8 AS relevance FROM episodes x WHERE {where} "
           "ORDER BY x.created_at DESC, x.id ASC LIMIT :limit")
    return [dict(r) for r in conn.execute(text(sql), params).mappings()]
