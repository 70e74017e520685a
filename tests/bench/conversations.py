"""The RealMem conversation dev set (../shared/datasets/realmem, Apache-2.0: "RealMem: Benchmarking LLMs in
Real-World Memory-Driven Interaction", arXiv 2601.06966) read as the retrieval benchmark uses it: turns, queries,
evidence by the dataset README's rule, and the ranking metrics.

Tune on personas 1-5 (alphabetical file order), report 6-10: ``split("dev")`` / ``split("test")``. LoCoMo's
conversations (``load_locomo``) are a second set, read from a file the user gives, never tuned on.
"""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Where the dev set lives: REALMEM_DIR, else ../shared/datasets/realmem beside (or above) the checkout.
_PLACES = [Path(os.environ["REALMEM_DIR"])] if os.environ.get("REALMEM_DIR") else []
_PLACES += [p / "shared" / "datasets" / "realmem" for p in ROOT.parents] + [Path("/work/shared/datasets/realmem")]
NAMESPACE = uuid.UUID("6f1c8a52-4f57-4e0e-9a3c-1d3b8b7e2a10")


@dataclass(frozen=True)
class Turn:
    """One episode: ``key`` = (session index, turn index); ``occurred_at`` strictly increases through the persona."""

    key: tuple[int, int]
    session_uuid: str
    session_id: uuid.UUID
    speaker: str
    text: str
    occurred_at: datetime

    @property
    def content(self) -> str:
        return f"{self.speaker}: {self.text}"


@dataclass(frozen=True)
class Query:
    query_id: str
    category: str
    text: str
    session: int  # the query's session index: only earlier sessions count
    evidence: frozenset[tuple[int, int]]  # turn keys
    sessions: frozenset[int]  # evidence session indexes (incl. points not tied to a turn)
    occurred_at: datetime


@dataclass
class Persona:
    name: str
    turns: list[Turn] = field(default_factory=list)
    queries: list[Query] = field(default_factory=list)


def dataset_dir() -> Path:
    for place in _PLACES:
        if any(place.glob("*_dialogues_256k.json")):
            return place
    raise FileNotFoundError(
        "the RealMem dev set was not found; set REALMEM_DIR to the folder holding its "
        f"*_dialogues_256k.json files (looked in {', '.join(map(str, _PLACES))})"
    )


def persona_files() -> list[Path]:
    return sorted(dataset_dir().glob("*_dialogues_256k.json"))


def split(name: str) -> list[int]:
    """Persona numbers (1-based, alphabetical): dev = 1-5 (tune here), test = 6-10 (report only)."""
    return {"dev": [1, 2, 3, 4, 5], "test": [6, 7, 8, 9, 10], "all": list(range(1, 11))}[name]


def _session_times(sessions: list[dict]) -> list[datetime]:
    """The session's date (``current_time``) plus a minute per earlier session of that date, so that time order is
    session order: a time bound separates "before this session" exactly."""
    out, previous = [], None
    for s in sessions:
        day = datetime.strptime(s["current_time"].split(" ")[0], "%Y-%m-%d").replace(hour=9, tzinfo=timezone.utc)
        start = max(day, previous + timedelta(hours=1)) if previous else day
        out.append(start)
        previous = start
    return out


def load(number: int) -> Persona:
    """Persona ``number`` (1-based): its turns as episodes and its queries with their evidence."""
    path = persona_files()[number - 1]
    data = json.loads(path.read_text())
    sessions = data["dialogues"]
    persona = Persona(name=data["_metadata"]["person_name"])
    index = {s["session_uuid"]: i for i, s in enumerate(sessions)}
    starts = _session_times(sessions)
    points = {}
    for i, s in enumerate(sessions):
        for m in s["extracted_memory"]:
            points[(m["session_uuid"], _text(m["content"]))] = (index.get(m["session_uuid"], i), m["source_turn"])
    for i, s in enumerate(sessions):
        sid = uuid.uuid5(NAMESPACE, f"{path.name}:{s['session_uuid']}:{i}")
        for j, t in enumerate(s["dialogue_turns"]):
            when = starts[i] + timedelta(seconds=j)
            persona.turns.append(Turn((i, j), s["session_uuid"], sid, t["speaker"], t["content"], when))
            if t.get("is_query") and t["speaker"] == "User":
                q = _query(t, s["dialogue_turns"][j + 1 : j + 2], i, points, index, when)
                if q is not None:
                    persona.queries.append(q)
    return persona


def _text(content: object) -> str:
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def _query(turn: dict, answer: list[dict], session: int, points: dict, index: dict, when: datetime) -> Query | None:
    """The README's rule: evidence turn = source_turn - 1 (1-based); source_turn <= 0 counts for sessions only;
    evidence in the query's own or a later session is dropped; a query left without turn evidence is dropped."""
    turns, sessions = set(), set()
    for used in (answer[0].get("memory_used") or []) if answer else []:
        found = points.get((used["session_uuid"], _text(used["content"])))
        if found is None or found[0] >= session:
            continue
        s, source = found
        sessions.add(s)
        if source > 0:
            turns.add((s, source - 1))
    if not turns:
        return None
    return Query(
        turn["query_id"],
        turn.get("category_name") or "?",
        turn["content"],
        session,
        frozenset(turns),
        frozenset(sessions),
        when,
    )


# --- LoCoMo (a second public conversation set, never tuned on) --------------------------------------------------

# The categories of LoCoMo's questions as its data numbers them; 5 (adversarial: the answer is not in the
# conversation) is left out, as retrieval evaluations of LoCoMo do.
LOCOMO_CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}


def locomo_samples(path: Path) -> list[dict]:
    """The samples of LoCoMo's ``locomo10.json`` (snap-research/LoCoMo, CC BY-NC 4.0: not shipped here; the
    benchmark reads the file the user gives)."""
    return json.loads(Path(path).read_text())


def load_locomo(sample: dict) -> Persona:
    """One LoCoMo conversation as a persona: every dialogue turn an episode (its image's caption appended, as
    LoCoMo's own evaluation does), every question of categories 1-4 a query asked after the last session, its
    evidence the turns its ``D<session>:<turn>`` ids name."""
    conversation = sample["conversation"]
    numbers = sorted(int(m.group(1)) for k in conversation if (m := re.fullmatch(r"session_(\d+)", k)))
    persona = Persona(name=str(sample.get("sample_id", "locomo")))
    keys, previous = {}, None
    for i, number in enumerate(numbers):
        when = datetime.strptime(conversation[f"session_{number}_date_time"], "%I:%M %p on %d %B, %Y")
        start = when.replace(tzinfo=timezone.utc)
        start = max(start, previous + timedelta(hours=1)) if previous else start
        previous = start
        sid = uuid.uuid5(NAMESPACE, f"locomo:{persona.name}:{number}")
        for j, t in enumerate(conversation[f"session_{number}"]):
            text = t["text"] + (f" [shares a photo: {t['blip_caption']}]" if t.get("blip_caption") else "")
            keys[t["dia_id"]] = (i, j)
            persona.turns.append(Turn((i, j), str(number), sid, t["speaker"], text, start + timedelta(seconds=j)))
    asked = previous + timedelta(days=1)
    for n, qa in enumerate(sample["qa"]):
        category = LOCOMO_CATEGORIES.get(qa.get("category"))
        # Some evidence entries hold several ids in one string ("D8:6; D9:17"): every id found counts.
        evidence = {keys[d] for e in qa.get("evidence", []) for d in re.findall(r"D\d+:\d+", e) if d in keys}
        if category and evidence:
            sessions = frozenset(s for s, _ in evidence)
            query = Query(
                f"{persona.name}-q{n}", category, qa["question"], len(numbers), frozenset(evidence), sessions, asked
            )
            persona.queries.append(query)
    return persona


# --- metrics -------------------------------------------------------------------------------------------------------


def ndcg(ranked: Sequence[tuple[int, int]], relevant: Iterable[tuple[int, int]], k: int = 10) -> float:
    relevant = set(relevant)
    gain = sum(1 / math.log2(i + 2) for i, key in enumerate(ranked[:k]) if key in relevant)
    ideal = sum(1 / math.log2(i + 2) for i in range(min(k, len(relevant))))
    return gain / ideal if ideal else 0.0


def recall(ranked: Sequence[tuple[int, int]], relevant: Iterable[tuple[int, int]], k: int) -> float:
    relevant = set(relevant)
    return len(relevant & set(ranked[:k])) / len(relevant) if relevant else 0.0


def session_recall(
    ranked: Sequence[tuple[int, int]], sessions: Iterable[int], k: int = 10, *, distinct: bool = False
) -> float:
    """Share of the evidence sessions among the sessions of the top ``k`` turns; ``distinct``: among the first
    ``k`` distinct sessions of the ranking instead (LongMemEval's turn-to-session evaluation, which widens the cut
    until it holds ``k`` sessions; here within the 20 turns every system returns)."""
    sessions = set(sessions)
    if not sessions:
        return 0.0
    if not distinct:
        return len(sessions & {s for s, _ in ranked[:k]}) / len(sessions)
    first = list(dict.fromkeys(s for s, _ in ranked))[:k]
    return len(sessions & set(first)) / len(sessions)


# S-R@10: evidence sessions among the top ten turns' sessions; S-R@10d: among the first ten distinct sessions.
METRICS = ("R@1", "R@5", "R@10", "R@20", "nDCG@10", "S-R@10", "S-R@10d")


def score(q: Query, ranked: Sequence[tuple[int, int]]) -> dict[str, float]:
    """Every metric of one query's ranking (turn keys, best first)."""
    return {
        "R@1": recall(ranked, q.evidence, 1),
        "R@5": recall(ranked, q.evidence, 5),
        "R@10": recall(ranked, q.evidence, 10),
        "R@20": recall(ranked, q.evidence, 20),
        "nDCG@10": ndcg(ranked, q.evidence),
        "S-R@10": session_recall(ranked, q.sessions),
        "S-R@10d": session_recall(ranked, q.sessions, distinct=True),
    }


def table(per_query: dict[str, list[tuple[Query, dict[str, float]]]]) -> list[tuple[str, str, int, dict[str, float]]]:
    """(system, category, n, mean metrics): overall ("all") first, then each category."""
    rows = []
    for system, scored in per_query.items():
        groups: dict[str, list[dict[str, float]]] = defaultdict(list)
        for q, m in scored:
            groups["all"].append(m)
            groups[q.category].append(m)
        for category in ["all"] + sorted(c for c in groups if c != "all"):
            ms = groups[category]
            rows.append((system, category, len(ms), {k: sum(m[k] for m in ms) / len(ms) for k in METRICS}))
    return rows


def fold(text: str) -> str:
    """Whitespace-folded text (the evidence-in-block check compares an evidence turn's first 60 characters)."""
    return re.sub(r"\s+", " ", text).strip()
