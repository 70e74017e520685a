"""Extraction quality: what a consolidation extractor learns from episodes, against labelled gold.

    python tests/bench/bench_extraction.py [--split dev|held|all] [--extractor heuristic|openai|all]
        [--base-url URL --model NAME [--api-key KEY]] [--batch N] [--show-errors] [--forms rule,dialogue]
    python tests/bench/bench_extraction.py --realmem [--personas 1,2] [--sessions N] [--sample 50]

1. The labelled set (``tests/bench/extraction_dataset.py``: 210 episodes, 40 % held back and never tuned on): each
   case is one extraction request (its butler, its known facts), and is scored against its gold:
   - a fact matches a gold fact when the subject agrees (casefolded; "the user" = "user"), the predicate's
     vocabulary base agrees, and the contents mean the same (MiniLM cosine >= 0.9; measured on the dev split:
     two different gold facts of one subject and predicate reach 0.82 at p95 and 0.93 at most ("allergic to dust
     mites" / "to pollen"), the heuristic's facts against their gold 0.97 at least); one-to-one;
   - precision / recall / F1 of facts; subject accuracy (of the predicted facts whose predicate and content match
     a gold fact, the share with its subject), permanence accuracy and scope correctness (of the matched facts;
     gold scope "butler" is the case's butler); rules precision / recall (cosine >= 0.7 on the content: a rule
     is worded freely, and two different gold rules reach 0.68 at most); "nothing" accuracy (cases with no gold fact or rule that yield none); contradiction
     recall (cases that take back a known fact: a contradiction or a superseding fact names it); episodes/s.
2. ``--realmem``: RealMem's sessions (``../shared/datasets/realmem``) carry the memory points a careful extractor
   took from each (``extracted_memory``). Every session of a persona, in order, is one request (its turns as
   ``"<Speaker>: <text>"`` episodes, the facts learned so far as known facts); a point is covered when a learned
   fact or rule is within cosine 0.6 of it (their points are long sentences, often with a category prefix, which
   is dropped; ours are short: checked by hand, 16 of the full run's 17 matches, from 0.60 up, were true - see
   BENCHMARKS.md). Prints coverage per persona and facts/rules per session; ``--sample N`` prints N
   seeded matches to check by hand.

Prints the machine-speed reference line first. An extractor that is not available (no ``--base-url`` for openai)
is skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from memory_workers.extractors import build_extractor  # noqa: E402
from shared.config import ConsolidationSettings  # noqa: E402
from shared.embedding import get_embedder  # noqa: E402
from shared.extraction import EpisodeIn, Extraction, ExtractionRequest, KnownFact  # noqa: E402
from shared.vocabulary import base_predicate  # noqa: E402
from tests.bench import conversations as rm  # noqa: E402
from tests.bench.common import reference_line  # noqa: E402
from tests.bench.extraction_dataset import CASES, Case  # noqa: E402

FACT_MATCH = 0.9
RULE_MATCH = 0.7
POINT_MATCH = 0.6
T0 = datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)


def subject_key(subject: str) -> str:
    key = " ".join(subject.casefold().split())
    return "user" if key in ("user", "the user", "users") else key


class Similarity:
    """Cosine of MiniLM embeddings, cached per text."""

    def __init__(self) -> None:
        self._embedder = get_embedder()
        self._cache: dict[str, np.ndarray] = {}

    def vectors(self, texts: Sequence[str]) -> None:
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            for text, vec in zip(missing, self._embedder.embed(missing), strict=True):
                self._cache[text] = vec

    def __call__(self, a: str, b: str) -> float:
        self.vectors([a, b])
        return float(np.dot(self._cache[a], self._cache[b]))


@dataclass
class Score:
    """Counts over cases; the figures are ratios of them."""

    facts_predicted: int = 0
    facts_gold: int = 0
    facts_matched: int = 0
    subject_seen: int = 0
    subject_right: int = 0
    permanence_right: int = 0
    scope_right: int = 0
    rules_predicted: int = 0
    rules_gold: int = 0
    rules_matched: int = 0
    nothing_cases: int = 0
    nothing_right: int = 0
    retraction_cases: int = 0
    retraction_right: int = 0
    episodes: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, float | None]:
        def ratio(a: int, b: int) -> float | None:
            return a / b if b else None

        p, r = ratio(self.facts_matched, self.facts_predicted), ratio(self.facts_matched, self.facts_gold)
        return {
            "fact P": p,
            "fact R": r,
            "fact F1": 2 * p * r / (p + r) if p and r else 0.0,
            "subject": ratio(self.subject_right, self.subject_seen),
            "permanence": ratio(self.permanence_right, self.facts_matched),
            "scope": ratio(self.scope_right, self.facts_matched),
            "rule P": ratio(self.rules_matched, self.rules_predicted),
            "rule R": ratio(self.rules_matched, self.rules_gold),
            "nothing": ratio(self.nothing_right, self.nothing_cases),
            "retraction": ratio(self.retraction_right, self.retraction_cases),
            "episodes/s": self.episodes / self.seconds if self.seconds else None,
        }


def request_for(case: Case) -> ExtractionRequest:
    known = [
        KnownFact(
            id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{case.id}:{n}")),
            subject=k.subject,
            predicate=k.predicate,
            content=k.content,
            permanence=k.permanence,
            scope=case.butler,
        )
        for n, k in enumerate(case.known)
    ]
    episode = EpisodeIn(
        id=str(uuid.uuid5(uuid.NAMESPACE_URL, case.id)),
        seq=1,
        butler=case.butler,
        content=case.content,
        created_at=T0,
        importance=5,
    )
    return ExtractionRequest(tenant_id="bench", butler=case.butler, episodes=[episode], facts=known)


def score_case(case: Case, request: ExtractionRequest, got: Extraction, sim: Similarity, score: Score) -> None:
    """Add one case's outcome to ``score`` (and a line per mistake to its errors)."""
    gold = list(case.facts)
    score.facts_predicted += len(got.facts)
    score.facts_gold += len(gold)
    free = set(range(len(gold)))
    for fact in got.facts:
        base = base_predicate(fact.predicate)
        same = [
            i
            for i in range(len(gold))
            if base_predicate(gold[i].predicate) == base and sim(fact.content, gold[i].content) >= FACT_MATCH
        ]
        subject_ok = [i for i in same if subject_key(gold[i].subject) == subject_key(fact.subject)]
        score.subject_seen += bool(same)
        score.subject_right += bool(subject_ok)
        right = [i for i in subject_ok if i in free]
        if right:
            i = max(right, key=lambda j: sim(fact.content, gold[j].content))
            free.discard(i)
            score.facts_matched += 1
            score.permanence_right += fact.permanence == gold[i].permanence
            score.scope_right += fact.scope == (request.butler if gold[i].scope == "butler" else gold[i].scope)
            if fact.permanence != gold[i].permanence:
                score.errors.append(f"{case.id} permanence {fact.permanence} != {gold[i].permanence}: {fact.content}")
        else:
            score.errors.append(
                f"{case.id} [{case.form}] extra fact: {fact.subject} | {fact.predicate} | "
                f"{fact.content}   <- {case.content[:90]}"
            )
    score.errors += [
        f"{case.id} [{case.form}] missed fact: {gold[i].subject} | {gold[i].predicate} | "
        f"{gold[i].content}   <- {case.content[:90]}"
        for i in sorted(free)
    ]
    score.rules_predicted += len(got.rules)
    score.rules_gold += len(case.rules)
    left = set(range(len(case.rules)))
    for rule in got.rules:
        near = [i for i in left if sim(rule.content, case.rules[i]) >= RULE_MATCH]
        if near:
            left.discard(near[0])
            score.rules_matched += 1
        else:
            score.errors.append(f"{case.id} [{case.form}] extra rule: {rule.content}")
    score.errors += [
        f"{case.id} [{case.form}] missed rule: {case.rules[i]}   <- {case.content[:90]}" for i in sorted(left)
    ]
    if not case.facts and not case.rules:
        score.nothing_cases += 1
        score.nothing_right += not got.facts and not got.rules
    if case.contradicts:
        score.retraction_cases += 1
        known = {f.id for f in request.facts if base_predicate(f.predicate) in case.contradicts}
        named = {c.fact_id for c in got.contradictions} | {f.supersedes_fact_id for f in got.facts}
        score.retraction_right += bool(known & named)
        if not known & named:
            score.errors.append(f"{case.id} [{case.form}] retraction not seen   <- {case.content[:90]}")


def run_cases(extractor, cases: Sequence[Case], sim: Similarity, batch: int) -> Score:  # noqa: ANN001
    """Score every case; with ``batch`` > 1 that many cases go to the extractor as one request (one episode each,
    their known facts together, the first case's butler) and its answer is split back by source episode and
    known-fact id. The extractor then reads unrelated cases as one user's episodes (a later "I live in X" replaces
    an earlier one): batching is for a model's throughput, the quality figures are batch 1's."""
    score = Score()
    requests = [request_for(c) for c in cases]
    sim.vectors([f.content for c in cases for f in c.facts] + [r for c in cases for r in c.rules])
    for start in range(0, len(cases), batch):
        chunk = list(zip(cases[start : start + batch], requests[start : start + batch], strict=True))
        t0 = time.perf_counter()
        if batch == 1:
            answers = [_safe(extractor, r) for _, r in chunk]
        else:
            merged = ExtractionRequest(
                tenant_id="bench",
                butler=chunk[0][1].butler,
                episodes=[e for _, r in chunk for e in r.episodes],
                facts=[f for _, r in chunk for f in r.facts],
            )
            answer = _safe(extractor, merged)
            chunk = [(case, r.model_copy(update={"butler": merged.butler})) for case, r in chunk]
            answers = [_part(answer, r) for _, r in chunk]
        score.seconds += time.perf_counter() - t0
        score.episodes += len(chunk)
        for (case, request), got in zip(chunk, answers, strict=True):
            score_case(case, request, got, sim, score)
    return score


def _part(got: Extraction, request: ExtractionRequest) -> Extraction:
    """The part of a batched answer that came from ``request``'s episode (or names its known facts)."""
    mine = {e.id for e in request.episodes}
    known = {f.id for f in request.facts}
    return Extraction(
        facts=[f for f in got.facts if set(f.source_episode_ids) & mine],
        rules=[r for r in got.rules if set(r.source_episode_ids) & mine],
        contradictions=[c for c in got.contradictions if c.fact_id in known],
    )


def _safe(extractor, request: ExtractionRequest) -> Extraction:  # noqa: ANN001
    """An extractor error counts as an empty answer (and is printed): the worker would retry it."""
    try:
        return extractor.extract(request)
    except Exception as exc:  # noqa: BLE001 - a benchmark reports, it does not stop
        print(f"  extraction failed for {request.episodes[0].id}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return Extraction()


def _fmt(value: float | None) -> str:
    return "    -" if value is None else f"{value:>7.1f}" if value > 10 else f"{value:>7.3f}"


def print_table(rows: list[tuple[str, str, int, dict[str, float | None]]]) -> None:
    names = list(rows[0][3])
    print(f"{'extractor':<12}{'split':<8}{'cases':>6}" + "".join(f"{n:>11}" for n in names))
    for extractor, split, n, figures in rows:
        print(f"{extractor:<12}{split:<8}{n:>6}" + "".join(f"{_fmt(figures[k]):>11}" for k in names))


# --- RealMem coverage ----------------------------------------------------------------------------------------

_CATEGORY = re.compile(r"^\s*(?:\[[^\]]*\]|【[^】]*】)\s*")


def realmem(extractor, personas: Sequence[int], sessions: int | None, sim: Similarity, sample: int) -> None:  # noqa: ANN001
    matches: list[tuple[float, str, str]] = []
    print(f"\nRealMem coverage (a point covered by a learned fact or rule at cosine >= {POINT_MATCH}):")
    print(
        f"{'persona':<9}{'sessions':>9}{'points':>8}{'covered':>9}{'share':>8}{'facts':>7}{'rules':>7}"
        f"{'per session':>13}"
    )
    for number in personas:
        data = json.loads(rm.persona_files()[number - 1].read_text())
        known: dict[tuple[str, str], KnownFact] = {}
        points = covered = n_facts = n_rules = 0
        chosen = data["dialogues"][:sessions] if sessions else data["dialogues"]
        for i, session in enumerate(chosen):
            episodes = [
                EpisodeIn(
                    id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{number}:{i}:{j}")),
                    seq=j,
                    butler="assistant",
                    content=f"{t['speaker']}: {rm._text(t['content'])}"[:20000],
                    created_at=T0 + timedelta(days=i, seconds=j),
                    importance=5,
                )
                for j, t in enumerate(session["dialogue_turns"])
            ]
            request = ExtractionRequest(
                tenant_id="bench", butler="assistant", episodes=episodes, facts=list(known.values())[-200:]
            )
            got = _safe(extractor, request)
            learned = [f.content for f in got.facts] + [r.content for r in got.rules]
            n_facts, n_rules = n_facts + len(got.facts), n_rules + len(got.rules)
            for f in got.facts:
                known[(subject_key(f.subject), f.predicate)] = KnownFact(
                    id=str(uuid.uuid4()),
                    subject=f.subject,
                    predicate=f.predicate,
                    content=f.content,
                    permanence=f.permanence,
                    scope=f.scope,
                )
            for point in session["extracted_memory"]:
                text = _CATEGORY.sub("", rm._text(point["content"]))
                points += 1
                if learned:
                    best = max(learned, key=lambda x: sim(text, x))
                    value = sim(text, best)
                    if value >= POINT_MATCH:
                        covered += 1
                        matches.append((value, text, best))
        share = covered / points if points else 0.0
        print(
            f"{number:<9}{len(chosen):>9}{points:>8}{covered:>9}{share:>8.3f}{n_facts:>7}{n_rules:>7}"
            f"{(n_facts + n_rules) / max(1, len(chosen)):>13.2f}"
        )
    if sample and matches:
        print(f"\n{min(sample, len(matches))} sampled matches (seed 7) to check by hand: cosine | point | learned")
        for value, point, learned in random.Random(7).sample(matches, min(sample, len(matches))):
            print(f"  {value:.2f} | {point[:110]} | {learned[:90]}")


# --- the command ---------------------------------------------------------------------------------------------


def extractors(args: argparse.Namespace) -> list[tuple[str, object]]:
    names = ["heuristic", "openai"] if args.extractor == "all" else [args.extractor]
    out = []
    for name in names:
        if name == "openai" and not args.base_url:
            print("openai: skipped (no --base-url; any OpenAI-compatible endpoint: OpenAI, Ollama, vLLM, llama.cpp)")
            continue
        settings = ConsolidationSettings(
            extractor=name,
            openai_base_url=args.base_url or "http://127.0.0.1:1/v1",
            openai_model=args.model,
            openai_api_key=args.api_key,
            openai_timeout_seconds=args.timeout,
            openai_response_format=args.response_format,
        )
        out.append((name, build_extractor(settings)))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--split",
        choices=("dev", "held", "all"),
        default="all",
        help="dev = tuned on; held = the held-back 40 %% (report only); all = both, one row each",
    )
    parser.add_argument("--extractor", choices=("heuristic", "openai", "all"), default="heuristic")
    parser.add_argument("--base-url", help="an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8088/v1")
    parser.add_argument("--model", default="local")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument(
        "--response-format",
        choices=("json_schema", "json_object"),
        default="json_schema",
        help="json_object for llama-cpp-python's server (deploy/local-llm.sh)",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=1,
        help="cases sent as one request (several episodes per model call); scored case by case",
    )
    parser.add_argument("--forms", help="comma-separated forms to keep (e.g. rule,dialogue)")
    parser.add_argument(
        "--show-errors", action="store_true", help="print every mistake (dev only, unless --split held)"
    )
    parser.add_argument("--realmem", action="store_true", help="coverage of RealMem's memory points instead")
    parser.add_argument("--personas", default="1,2,3,4,5", help="with --realmem")
    parser.add_argument("--sessions", type=int, help="with --realmem: at most this many sessions per persona")
    parser.add_argument("--sample", type=int, default=0, help="with --realmem: print N matches to check by hand")
    args = parser.parse_args()
    print(reference_line())
    sim = Similarity()
    chosen = extractors(args)
    if args.realmem:
        for name, extractor in chosen:
            print(f"\n== {name} ==")
            realmem(extractor, [int(p) for p in args.personas.split(",")], args.sessions, sim, args.sample)
        return 0
    forms = set(args.forms.split(",")) if args.forms else None
    splits = ("dev", "held") if args.split == "all" else (args.split,)
    rows = []
    for name, extractor in chosen:
        for split in splits:
            cases = [c for c in CASES if c.split == split and (forms is None or c.form in forms)]
            score = run_cases(extractor, cases, sim, args.batch)
            rows.append((name, split, len(cases), score.figures()))
            if args.show_errors and (split == "dev" or args.split == "held"):
                print(f"\n{name}, {split}: {len(score.errors)} mistakes")
                print("\n".join("  " + e for e in score.errors))
    print(f"\nextraction quality on the labelled set ({datetime.now(timezone.utc):%Y-%m-%d}):")
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
