"""Redaction's false positives on ordinary conversation text, and its cost per write.

    python tests/bench/bench_redaction.py [--split dev|test|all] [--show N]

Runs every detector of shared.redaction over every turn of the RealMem conversation set (the dev split by default:
personas 1-5, the turns as episodes store them, "speaker: text") and prints the matches per detector (each hit with
its text, to inspect: the set holds no real personal data, so every hit is a false positive unless the turn itself
makes one up) and the time per turn (µs, p50/p95/mean of the full default policy). Needs no database.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from shared.redaction import DETECTORS, RedactionPolicy, redact  # noqa: E402
from tests.bench import conversations as rm  # noqa: E402
from tests.bench.common import reference_line  # noqa: E402


def turns(split: str) -> list[str]:
    numbers = rm.split("dev") + rm.split("test") if split == "all" else rm.split(split)
    return [turn.content for n in numbers for turn in rm.load(n).turns]


def false_positives(texts: list[str]) -> dict[str, list[tuple[str, str]]]:
    """Per detector: (placeholder-bearing excerpt, original excerpt) of each turn it changed, run alone."""
    hits: dict[str, list[tuple[str, str]]] = {name: [] for name in DETECTORS}
    for name in DETECTORS:
        policy = RedactionPolicy(detectors=frozenset({name}))
        for text in texts:
            out = redact(text, policy)
            if out.counts:
                at = next(i for i, (a, b) in enumerate(zip(out.text, text)) if a != b)
                hits[name].append((_excerpt(out.text, at), _excerpt(text, at)))
    return hits


def cost_us(texts: list[str], rounds: int = 3) -> tuple[float, float, float]:
    """p50, p95 and mean µs of redact() with every detector on, over every turn (best of ``rounds`` per turn)."""
    policy = RedactionPolicy()
    per_turn = []
    for text in texts:
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            redact(text, policy)
            best = min(best, time.perf_counter() - t0)
        per_turn.append(best * 1e6)
    per_turn.sort()
    return statistics.median(per_turn), per_turn[int(len(per_turn) * 0.95)], statistics.fmean(per_turn)


def _excerpt(text: str, at: int, width: int = 70) -> str:
    return text[max(0, at - width // 2) : at + width].replace("\n", " ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=("dev", "test", "all"), default="dev")
    parser.add_argument("--show", type=int, default=20, help="hits to print per detector")
    args = parser.parse_args()
    texts = turns(args.split)
    chars = sum(len(t) for t in texts)
    print(f"RealMem {args.split}: {len(texts)} turns, {chars / len(texts):.0f} characters per turn on average")
    hits = false_positives(texts)
    totals = Counter({name: len(found) for name, found in hits.items()})
    for name in DETECTORS:
        print(f"  {name:<12} turns changed: {totals[name]}")
        for redacted, original in hits[name][: args.show]:
            print(f"      - {redacted!r}\n        was {original!r}")
    p50, p95, mean = cost_us(texts)
    print(f"cost per turn (every detector): p50 {p50:.1f} µs, p95 {p95:.1f} µs, mean {mean:.1f} µs")
    print(reference_line())


if __name__ == "__main__":
    main()
