"""Episodes in their conversation: the turn before a turn (its context) and windows of long episodes.

A chat turn alone ("Yes, twice last month!") often cannot answer a question; the turn before it can say what it
is about. Each episode with a ``session_id`` carries ``preceding``: the start (:data:`PRECEDING_CHARS`) of the turn
just before it among the same butler's episodes of that session, in (``occurred_at``, ``seq``) order. It is
indexed as a second, lower-weighted keyword field (``context_vector``), the turn is also embedded read after it
(``episode_vectors`` n = 0), and it is never shown as the episode's content.

The rule (set-based, in the apply transaction): after a batch is inserted, every episode of the batch's
(butler, session) pairs whose ``preceding`` differs from what its session now says is updated. So a turn that
arrives before its predecessor is re-contextualised when the predecessor lands, in that one statement.

Long episodes: the model reads the first 256 word pieces only; an episode longer than that is also embedded as
overlapping windows (``episode_vectors`` n >= 1; the first from where its own vector's reading is overlapped) and
is as near to a query as its nearest window.

Measured on persona 1 of the conversation dev split (BENCHMARKS.md): the contextual vector and the windows each add about
0.04 to dense recall@10; the preceding turn as a keyword field helps BM25 alone (+0.03) and little within the
fusion (kept at a low weight).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Connection, text
from sqlalchemy.dialects.postgresql import insert

from shared.models import episode_vectors

# Characters of each preceding turn kept: the lexical context needs the gist, not a second copy of a long turn.
PRECEDING_CHARS = 2000
WINDOW_TOKENS = 200  # word pieces per window: under the model's 256 with room for its special tokens
WINDOW_STRIDE = 150  # a window starts every 150 word pieces (50 overlap: a sentence cut by one is whole in the next)


def window_spans(
    offsets: Sequence[tuple[int, int]],
    *,
    size: int = WINDOW_TOKENS,
    stride: int = WINDOW_STRIDE,
    longer_than: int = 250,
) -> list[tuple[int, int]]:
    """Character spans of the overlapping windows of a text whose word pieces have ``offsets``; none when the
    model reads it whole (``longer_than`` word pieces or fewer).

    The first window starts at ``stride``, not 0: the episode's own vector already reads the first ``longer_than``
    word pieces, and overlaps that window by ``longer_than - stride``."""
    n = len(offsets)
    if n <= longer_than:
        return []
    spans = []
    for start in range(stride, n, stride):
        end = min(start + size, n)
        spans.append((offsets[start][0], offsets[end - 1][1]))
        if end == n:
            break
    return spans


@dataclass(frozen=True)
class StoredEpisode:
    id: uuid.UUID
    butler: str
    session_id: uuid.UUID | None
    content: str


Embed = Callable[[Sequence[str]], np.ndarray]
Offsets = Callable[[Sequence[str]], list[list[tuple[int, int]]]]


def contextual_text(preceding: str, content: str) -> str:
    """What the contextual vector embeds: the turn read after the one before it."""
    return f"{preceding}\n{content}"


CONTEXTUALISE = text(f"""
WITH turns AS (
    SELECT e.id, e.created_at, e.preceding,
           lag(left(e.content, {PRECEDING_CHARS}), 1) OVER w AS p1
    FROM episodes e
    JOIN (SELECT DISTINCT butler, session_id FROM unnest(CAST(:butlers AS text[]), CAST(:sessions AS uuid[]))
          AS k(butler, session_id)) k ON e.butler = k.butler AND e.session_id = k.session_id
    WHERE e.tenant_id = :tenant_id AND e.forgotten_at IS NULL
    WINDOW w AS (PARTITION BY e.butler, e.session_id ORDER BY e.occurred_at, e.seq)
)
UPDATE episodes x SET preceding = t.p1
FROM turns t
WHERE x.tenant_id = :tenant_id AND x.id = t.id AND x.created_at = t.created_at AND x.preceding IS DISTINCT FROM t.p1
RETURNING x.id, x.butler, x.content, x.preceding
""")


def index_episodes(
    conn: Connection, *, tenant_id: str, stored: Sequence[StoredEpisode], embed: Embed, offsets: Offsets
) -> dict[str, int]:
    """After a batch of episodes is inserted (same transaction): window vectors of the long ones, ``preceding``
    brought up to date in their sessions, and the contextual vector of every episode whose ``preceding`` changed.
    Returns how many of each were written."""
    windows = _windows(stored, offsets)
    changed = contextualise(conn, tenant_id=tenant_id, sessions=[(e.butler, e.session_id) for e in stored])
    with_context = [r for r in changed if r["preceding"] is not None]
    texts = [t for _, _, t in windows] + [contextual_text(r["preceding"], r["content"]) for r in with_context]
    vectors = embed(texts) if texts else np.zeros((0, 384), dtype=np.float32)
    rows = [{"episode_id": eid, "n": n, "embedding": v} for (eid, n, _), v in zip(windows, vectors)]
    rows += [{"episode_id": r["id"], "n": 0, "embedding": v} for r, v in zip(with_context, vectors[len(windows) :])]
    owners = {e.id: e.butler for e in stored} | {r["id"]: r["butler"] for r in changed}
    if rows:
        stmt = insert(episode_vectors).values(
            [{**r, "tenant_id": tenant_id, "butler": owners[r["episode_id"]]} for r in rows]
        )
        conn.execute(
            stmt.on_conflict_do_update(index_elements=["episode_id", "n"], set_={"embedding": stmt.excluded.embedding})
        )
    lost = [r["id"] for r in changed if r["preceding"] is None]  # its predecessor was forgotten
    if lost:
        conn.execute(episode_vectors.delete().where(episode_vectors.c.episode_id.in_(lost), episode_vectors.c.n == 0))
    return {"windows": len(windows), "contextualised": len(changed)}


def rebuild_vectors(conn: Connection, *, rows: Sequence[dict[str, Any]], embed: Embed, offsets: Offsets) -> int:
    """Replace the other vectors of stored episodes (``rows``: id, tenant_id, butler, content, preceding), e.g.
    after a model change. Returns how many vectors were written."""
    stored = [StoredEpisode(r["id"], r["butler"], None, r["content"]) for r in rows]
    windows = _windows(stored, offsets)
    with_context = [r for r in rows if r["preceding"] is not None]
    texts = [t for _, _, t in windows] + [contextual_text(r["preceding"], r["content"]) for r in with_context]
    vectors = embed(texts) if texts else np.zeros((0, 384), dtype=np.float32)
    owner = {r["id"]: r for r in rows}
    out = [(eid, n, v) for (eid, n, _), v in zip(windows, vectors)]
    out += [(r["id"], 0, v) for r, v in zip(with_context, vectors[len(windows) :])]
    conn.execute(episode_vectors.delete().where(episode_vectors.c.episode_id.in_(list(owner))))
    if out:
        conn.execute(
            episode_vectors.insert(),
            [
                {
                    "episode_id": eid,
                    "n": n,
                    "embedding": v,
                    "tenant_id": owner[eid]["tenant_id"],
                    "butler": owner[eid]["butler"],
                }
                for eid, n, v in out
            ],
        )
    return len(out)


def _windows(stored: Sequence[StoredEpisode], offsets: Offsets) -> list[tuple[uuid.UUID, int, str]]:
    """(episode id, window number from 1, window text) for every episode longer than the model reads."""
    out = []
    for e, spans in zip(stored, (window_spans(o) for o in offsets([e.content for e in stored]))):
        out += [(e.id, n, e.content[a:b]) for n, (a, b) in enumerate(spans, start=1)]
    return out


def contextualise(conn: Connection, *, tenant_id: str, sessions: Sequence[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Bring ``preceding`` up to date for every episode of the given (butler, session_id) pairs; returns the rows
    that changed (id, butler, content, new preceding): the new turns, and any stored turn whose predecessor
    arrived late."""
    pairs = sorted({(b, s) for b, s in sessions if s is not None}, key=str)
    if not pairs:
        return []
    result = conn.execute(
        CONTEXTUALISE, {"tenant_id": tenant_id, "butlers": [b for b, _ in pairs], "sessions": [s for _, s in pairs]}
    )
    return [dict(r) for r in result.mappings()]
