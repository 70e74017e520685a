"""The load-test tool's pure parts: generated text, percentiles, drill windows, the order check, the verdict."""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Any

import pytest

from memory_api.cli import loadtest as loadtest_cli
from memory_api.loadtest import burst, generator, verify
from memory_api.loadtest.client import StartLine, is_transport_error
from memory_api.loadtest.metrics import Accept, Recorder, latency_summary, percentile


def _accept(
    client: int, position: int, id_: str, *, butler: str = "health", at: float = 1.0, latency_ms: float = 10.0
) -> Accept:
    return Accept(
        "t-a", butler, client, position, id_, f"k-{client}-{position}", at, at, latency_ms, latency_ms, 1, False
    )


def test_generated_episodes_are_deterministic_unique_and_carry_their_tenants_marker():
    # given a run of two tenants
    tenants = generator.plan_tenants("abcd1234", count=2, butlers=3)

    # when two clients of the same tenant plan their episodes twice
    first = generator.client_episodes("abcd1234", client=0, count=200, tenant=tenants[0], seed=7)
    again = generator.client_episodes("abcd1234", client=0, count=200, tenant=tenants[0], seed=7)
    other = generator.client_episodes("abcd1234", client=2, count=200, tenant=tenants[0], seed=7)

    # then the plan is reproducible, every text and key is unique, and every text carries only its marker
    assert first == again
    everything = first + other
    assert len({e.content for e in everything}) == len({e.idempotency_key for e in everything}) == 400
    assert all(tenants[0].marker in e.content and tenants[1].marker not in e.content for e in everything)
    assert {e.butler for e in first} == set(tenants[0].butlers) == {"health", "travel", "finance"}
    assert [e.position for e in first] == list(range(200))
    assert tenants[0].tenant_id == "lt-abcd1234-00" and tenants[0].marker == "ltabcd1234t00"


def test_the_text_is_varied_and_sometimes_extractable():
    rng = random.Random(1)
    texts = [generator.episode_text(rng, butler) for butler in generator.BUTLER_NAMES for _ in range(50)]
    assert len(set(texts)) > 350
    assert any("I live in" in t or "Always confirm" in t or "My name is" in t for t in texts)


def test_clients_and_episodes_are_dealt_evenly():
    tenants = generator.plan_tenants("r", count=3, butlers=2)
    assert generator.split_evenly(10, 4) == [3, 3, 2, 2]
    assert sum(generator.split_evenly(10_000, 50)) == 10_000
    assert [generator.client_tenant(c, tenants).index for c in range(5)] == [0, 1, 2, 0, 1]
    assert generator.butler_names(10)[-1] == "butler09"


def test_percentiles_by_nearest_rank():
    values = list(range(1, 101))
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile([], 50) is None
    assert latency_summary([3.0, 1.0, 2.0]) == {"count": 3, "p50": 2.0, "p95": 3.0, "p99": 3.0, "max": 3.0}


def test_accepts_inside_a_drill_window_are_counted():
    # given a recorder with a postgres outage from t=2 to t=5
    recorder = Recorder()
    recorder.events += [{"t": 2.0, "event": "postgres_down"}, {"t": 5.0, "event": "postgres_restoring"}]
    recorder.accepts += [_accept(0, 0, "a", at=1.9), _accept(0, 1, "b", at=3.0), _accept(0, 2, "c", at=6.0)]

    # then only the call that started and ended inside the window counts
    assert recorder.window("postgres") == (2.0, 5.0)
    assert recorder.window("redis") is None
    assert recorder.accepted_within((2.0, 5.0)) == 1


def test_order_is_checked_per_client_and_key():
    # given one client's writes to two butlers, and the seqs the database gave them
    accepts = [_accept(0, 0, "a"), _accept(0, 1, "b", butler="travel"), _accept(0, 2, "c"), _accept(0, 3, "d")]
    in_order = {"a": 1, "c": 2, "d": 3, "b": 1}
    swapped = {"a": 1, "c": 3, "d": 2, "b": 1}

    # then seqs must grow with the send order within (tenant, butler, client); a missing id is skipped
    assert verify.out_of_order(accepts, in_order) == 0
    assert verify.out_of_order(accepts, swapped) == 1
    assert verify.out_of_order(accepts, {"a": 1, "d": 3}) == 0


def test_the_verdict_names_every_broken_promise():
    clean = {
        "drained": True,
        "database": {
            "lost": 0,
            "duplicated": 0,
            "out_of_order": 0,
            "non_terminal": 0,
            "cross_tenant_sql": 0,
            "unacknowledged": 0,
        },
        "isolation": {"leaks": 0, "own_marker_hits": {"a": 3, "b": 2}},
        "counts": {},
        "dead_parts": [],
    }
    assert verify.verdict(clean) == []

    broken = {
        **clean,
        "drained": False,
        "drain_timeout_s": 5,
        "database": {**clean["database"], "lost": 2, "out_of_order": 1, "unacknowledged": 1},
        "isolation": {"leaks": 1, "own_marker_hits": {"a": 0}},
        "counts": {"rejected_invalid_input": 3, "replay_mismatch": 1},
        "dead_parts": ["beat"],
        "accepted_while_db_down": 4,
    }
    failures = "\n".join(verify.verdict(broken))
    for words in (
        "not drained",
        "2 accepted episodes lost",
        "1 episodes out of order",
        "never acknowledged",
        "1 cross-tenant hits",
        "proves nothing",
        "3 writes rejected (invalid_input)",
        "replays answered a different id",
        "beat",
        "4 writes answered 'accepted' while PostgreSQL",
    ):
        assert words in failures


def test_transport_errors_are_recognised_inside_exception_groups():
    assert is_transport_error(ConnectionRefusedError())
    assert is_transport_error(ExceptionGroup("sdk", [TimeoutError(), OSError()]))
    assert not is_transport_error(ExceptionGroup("sdk", [OSError(), KeyError("bug")]))
    assert not is_transport_error(ValueError())


def test_the_command_line_parses_tokens_and_bounds():
    parser = argparse.ArgumentParser()
    loadtest_cli.register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "loadtest",
            "burst",
            "--token",
            "acme=mb_x",
            "--token",
            "beta=mb_y",
            "--batch",
            "50",
            "--chaos",
            "redis",
            "--read-tool",
            "search",
        ]
    )
    assert dict(args.token) == {"acme": "mb_x", "beta": "mb_y"}
    assert (args.batch, args.chaos, args.read_tool, args.episodes, args.clients) == (50, "redis", "search", 1000, 50)
    with pytest.raises(SystemExit):
        parser.parse_args(["loadtest", "burst", "--token", "no-equals-sign"])
    with pytest.raises(SystemExit):
        parser.parse_args(["loadtest", "burst", "--clients", "0"])


def test_readers_share_one_pacer_so_their_reads_go_out_evenly_spaced():
    # given ten readers offering 50 reads/s between them
    config = burst.BurstConfig(episodes=20, clients=2, readers=10, read_rate=50.0)
    tenants = generator.plan_tenants("abcd1234", count=2, butlers=2)
    tokens = {t.tenant_id: "token" for t in tenants}
    start = StartLine(expected=0)
    _, readers = burst._clients(
        config, "http://unused", "abcd1234", tenants, tokens, Recorder(), asyncio.Event(), start
    )

    # when every reader asks for its next two slots at once, as they do when the burst starts
    async def slots() -> list[float]:
        times: list[float] = []

        async def reader(r: Any) -> None:
            for _ in range(2):
                await r.pacer.wait()
                times.append(time.monotonic())

        await asyncio.gather(*(reader(r) for r in readers))
        return sorted(times)

    times = asyncio.run(slots())

    # then they went out one per 20 ms slot, not ten at a time: at most five in the first 100 ms (a pacer never
    # releases a read early; a busy machine only releases them later)
    assert len(times) == 20
    assert sum(t - times[0] < 0.1 for t in times) <= 5


def test_no_client_calls_before_every_client_connected():
    async def scenario() -> tuple[list[str], list[str]]:
        line, passed = StartLine(expected=3), []

        async def client(name: str, connect_s: float) -> None:
            await asyncio.sleep(connect_s)  # opening its session
            await line.ready()
            passed.append(name)

        clients = [asyncio.create_task(client(n, s)) for n, s in (("a", 0.0), ("b", 0.02), ("c", 0.05))]
        await line.open_when_ready(timeout_s=5)
        arrived_first = list(passed)  # nobody went before the line opened
        await asyncio.gather(*clients)
        await line.ready()  # a client reconnecting mid-burst goes on at once
        # a line whose last client never arrives opens after its timeout
        stuck = StartLine(expected=2)
        await stuck.open_when_ready(timeout_s=0.05)
        return arrived_first, passed + (["late"] if stuck.go.is_set() else [])

    arrived_first, passed = asyncio.run(scenario())
    assert arrived_first == []
    assert sorted(passed) == ["a", "b", "c", "late"]
