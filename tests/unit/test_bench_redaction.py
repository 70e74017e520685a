"""A small run of tests/bench/bench_redaction.py: on one RealMem persona's turns, only real e-mail addresses and
phone numbers are found (the dataset holds no card, IBAN, national id or secret), and the figures print."""

from __future__ import annotations

import pytest

from tests.bench import bench_redaction
from tests.bench import conversations as rm


@pytest.fixture(scope="module")
def texts() -> list[str]:
    try:
        rm.dataset_dir()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    return [turn.content for turn in rm.load(1).turns]


def test_no_detector_fires_on_ordinary_conversation_text(texts: list[str]) -> None:
    # when every detector runs alone over every turn of persona 1
    hits = bench_redaction.false_positives(texts)
    # then none of the checksum- or shape-based detectors fires, and every e-mail/phone hit holds one for real
    assert {name: len(found) for name, found in hits.items() if name not in ("email", "phone")} == {
        "secret": 0,
        "iban": 0,
        "card": 0,
        "national_id": 0,
    }
    assert all("@" in original for _, original in hits["email"])
    assert all(any(ch.isdigit() for ch in original) for _, original in hits["phone"])
    p50, p95, mean = bench_redaction.cost_us(texts[:200], rounds=1)
    assert 0 < p50 <= p95 and mean > 0
