"""The fuzzing campaign in the suite (issue 16 §E): 1,000 calls drawn from every tool's own inputSchema and hostile
values (NUL, lone surrogates, 1 MB strings, deep nesting, huge and negative numbers, wrong types, unknown fields,
the other tenant's ids), through the real MCP client to a real `memory-butler serve` process over HTTP, on its own
database of the suite's PostgreSQL and the suite's Redis. The sequence is derandomised, so a run is repeatable.
What each answer counts as: tests/bench/fuzz_campaign.py; the 10,000-call run: tests/bench/bench_fuzz.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from shared import db
from tests.bench.fuzz_campaign import Campaign, Tally
from tests.bench.fuzz_world import FrontProcess, log_crashes, seed_tenants

CALLS = 1_000


@pytest.fixture(scope="module")
def fuzz_database_url(admin_url: str) -> Iterator[str]:
    """A database of its own: the package's worker (if another test started it) applies nothing of it, so the
    fingerprint a refused call must leave unchanged moves only by the fuzzer's calls."""
    name = f"mb_fuzz_{uuid.uuid4().hex[:10]}"
    db.ensure_database(admin_url, name)
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    db.migrate(url)
    yield url
    db.engine_for.cache_clear()
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="module")
def campaign_run(
    fuzz_database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Tally, Path, set[str]]]:
    log_path = tmp_path_factory.mktemp("fuzz") / "front.log"
    engine = db.make_engine(fuzz_database_url, pool_size=2)
    front = FrontProcess(fuzz_database_url, redis_url, log_path).start()
    try:
        a, b = seed_tenants(engine, front.url, fuzz_database_url, redis_url)
        campaign = Campaign(engine, front, a, b)
        with campaign.running():
            tally = campaign.run(CALLS, seed=None)
        campaign.finish()
        yield tally, log_path, set(campaign.schemas)
    finally:
        front.stop()
        engine.dispose()


Run = tuple[Tally, Path, set[str]]  # the tally, the front's log, the tools it listed


def test_every_call_answers_a_valid_result_or_a_classified_error(campaign_run: Run) -> None:
    tally, log_path, _ = campaign_run
    total = tally.total
    assert total["calls"] >= CALLS
    assert tally.failures() == {}, f"{tally.failures()}\n{tally.table()}\n{tally.first}"
    assert total["valid"] + total["classified"] == total["calls"], tally.table()
    assert log_crashes(log_path) == 0


def test_the_campaign_reaches_every_tool_both_ways(campaign_run: Run) -> None:
    tally, _, tools = campaign_run
    assert len(tools) >= 18 and set(tally.per_tool) == tools, sorted(tally.per_tool)
    total = tally.total
    assert total["hostile"] >= CALLS // 4 and total["valid"] >= CALLS // 5, tally.table()
    assert total["error:invalid_input"] and total["error:not_found"] and total["error:permission_denied"]
    # the parser's refusal of what the client cannot send (a lone surrogate, nesting past its limit)
    assert total["protocol:-32700"] > 0
    tools_with_valid = {tool for tool, c in tally.per_tool.items() if c["valid"]}
    assert len(tools_with_valid) >= 15, tally.table()


def test_the_checks_can_fail(campaign_run: Run) -> None:
    # given valid writes and an admin reading its own finance memories, when the campaign ran, then the write
    # check saw those writes and the leak check saw that text: a zero of theirs is not a blind spot
    tally, _, _ = campaign_run
    assert tally.total["valid_wrote"] > 0
    assert tally.total["admin_saw_finance"] > 0
