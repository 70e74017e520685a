"""Workers on several hosts: two worker hosts and a front in their own network namespaces, one Redis, one PostgreSQL.

Each "host" is a network namespace on this machine (tests/e2e/netns.py) reaching the shared Redis and the embedded
PostgreSQL over a private bridge subnet, never anything else. A load-test burst goes through the front; mid-burst,
one worker host is taken out while it holds a key's lock: killed (every process in its namespace SIGKILLed, then
its link cut), or cut off (only its link down: its processes live on and PostgreSQL hears nothing from them).
Its work must go to the other host: every shard queue served, nothing lost or duplicated, per-key order kept
across the handover, every episode consolidated once (the load test's own verification, plus the order checks
of tests/e2e/test_workers.py). Skips, saying why, where network namespaces cannot be made (not root, no netns).
The same run by hand: docs/hosts.md.
"""

from __future__ import annotations

import asyncio
import io
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from rich.console import Console
from sqlalchemy import text

from memory_api.loadtest.burst import BurstConfig, burst
from memory_api.loadtest.generator import butler_names
from memory_workers.tasks.ingest import apply_lock_key
from shared.db import unit_of_work
from shared.sharding import MAINTENANCE_QUEUE, ShardKey, queue_for, shard_queues
from shared.tenancy import create_token, ensure_tenant
from tests.e2e import netns
from tests.e2e.fleet import Fleet, lock_halves
from tests.polling import poll

pytestmark = pytest.mark.slow

SHARDS = 4
TENANTS = 2
BUTLERS = butler_names(4)
# The fleet's PostgreSQL sessions end this long after their host vanished (settings.dead_client_timeout_seconds).
DEAD_CLIENT_S = 6
# ~6 s of writes at 40/s from 8 clients; the host dies once 30% were accepted, so most of the burst (and the
# in-flight batch it held) lands on the survivor.
KILL: dict[str, Any] = {
    "episodes": 240,
    "clients": 8,
    "butlers": len(BUTLERS),
    "rate": 40.0,
    "chaos": "kill-host",
    "chaos_at": 0.3,
    "outage_s": 0.5,
    "drain_timeout_s": 120.0,
    "quiet": True,
}
# ~16 s of writes, cut off after 30% (the revived host has had ~5 s to take work): writes go on well past
# DEAD_CLIENT_S, so the key whose lock the cut-off host held gets writes (and with them consolidation wake-ups)
# after PostgreSQL freed it. (A key with no later write is
# woken by the delayed re-check that a busy run sends: docs/hosts.md.)
PARTITION: dict[str, Any] = {**KILL, "episodes": 220, "rate": 14.0, "chaos": "partition-host", "chaos_at": 0.3}


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    reason = netns.why_unavailable()
    if reason:
        pytest.skip(reason)
    running = Fleet(shard_count=SHARDS, dead_client_timeout_s=DEAD_CLIENT_S)
    with running:
        try:
            running.wait_ready()
        except BaseException:
            print(running.logs())
            raise
        yield running
    # the fleet left nothing behind: no process, namespace, link, server or data dir
    assert running.network.leftovers() == []
    assert all(p.popen.poll() is not None for p in running.procs.values())
    assert not running.postgres.running() and not running.work_dir.exists()


def covering_tenants() -> list[str]:
    """Tenant ids whose (tenant, butler) keys land on every shard queue, so every queue must be served."""
    while True:
        ids = [f"hosts-{uuid.uuid4().hex[:8]}" for _ in range(TENANTS)]
        if {queue_for(t, b, SHARDS) for t in ids for b in BUTLERS} == set(shard_queues(SHARDS)):
            return ids


def make_tokens(fleet: Fleet, tenant_ids: list[str]) -> dict[str, str]:
    tokens = {}
    with unit_of_work(fleet.engine) as conn:
        for tenant_id in tenant_ids:
            ensure_tenant(conn, tenant_id=tenant_id)
            _, tokens[tenant_id] = create_token(
                conn, tenant_id=tenant_id, name="hosts", butlers=list(BUTLERS), role="butler"
            )
    return tokens


def rows(fleet: Fleet, sql: str, **params: Any) -> list[Any]:
    with fleet.engine.connect() as conn:
        return list(conn.execute(text(sql), params))


def host_of(actor: str) -> str:
    """``worker:host-a@<run>`` -> ``host-a``."""
    return actor.removeprefix("worker:").split("@")[0]


def keys_of_locks(held: list[tuple[int, int]], tenant_ids: list[str]) -> set[tuple[str, str]]:
    """The run's keys whose consolidation or apply lock is among ``held`` (pg_locks' halves of a bigint key)."""
    keys = {}
    for key in ((t, b) for t in tenant_ids for b in BUTLERS):
        keys[lock_halves(ShardKey(*key).advisory_lock_key())] = key
        keys[lock_halves(apply_lock_key(*key))] = key
    return {keys[h] for h in held if h in keys}


def run_drill(fleet: Fleet, out: Path, drill: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A burst through the front on fresh tenants covering every shard queue, with ``drill`` mid-burst."""
    tenant_ids = covering_tenants()
    fleet.drill_tenants = tenant_ids
    config = BurstConfig(tokens=make_tokens(fleet, tenant_ids), out_dir=out, **drill)
    try:
        return asyncio.run(burst(config, stack=fleet, console=Console(file=io.StringIO()))), tenant_ids
    except BaseException:
        print(fleet.logs())
        raise


def test_a_worker_host_killed_mid_burst_hands_its_keys_to_the_other_host(fleet: Fleet, tmp_path: Path):
    # given two worker hosts that each consume every shard queue (as they answer themselves)
    every_queue = {*shard_queues(SHARDS), MAINTENANCE_QUEUE}
    assert fleet.active_queues() == {"host-a": every_queue, "host-b": every_queue}

    # when host-a is killed mid-burst while it holds a key's lock
    figures, tenant_ids = run_drill(fleet, tmp_path, KILL)

    # then nothing is lost, duplicated, reordered, left pending or leaked, and host-b did host-a's work
    try:
        assert_verified(figures, KILL)
        assert fleet.killed["pids"] and fleet.killed["still_running"] == []
        assert_host_a_was_taken_out_mid_work(fleet, figures, tenant_ids, "kill-host")
        assert_every_queue_served_and_order_kept(fleet, tenant_ids, KILL)
    except BaseException:
        print(fleet.logs())
        raise


def test_a_worker_host_cut_off_mid_burst_hands_its_keys_over_once_postgres_drops_it(fleet: Fleet, tmp_path: Path):
    # given host-a back (after the kill above) and sessions that end DEAD_CLIENT_S after their client vanished
    fleet.revive_host("host-a")
    with fleet.engine.connect() as conn:  # a TCP session made the way the fleet's parts make theirs
        assert conn.execute(text("SHOW tcp_user_timeout")).scalar_one() == str(DEAD_CLIENT_S * 1000)  # ms

    # when host-a's link goes down mid-burst while it holds a key's lock, its processes still running
    figures, tenant_ids = run_drill(fleet, tmp_path, PARTITION)

    # then PostgreSQL dropped host-a's sessions (their locks with them) and host-b finished everything in order
    try:
        assert fleet.killed["partition"] and fleet.killed["pids"]
        assert any(psutil.pid_exists(pid) for pid in fleet.killed["pids"])  # cut off, not dead
        assert_verified(figures, PARTITION)
        assert_host_a_was_taken_out_mid_work(fleet, figures, tenant_ids, "partition-host")
        assert_every_queue_served_and_order_kept(fleet, tenant_ids, PARTITION)
    except BaseException:
        print(fleet.logs())
        raise


def assert_verified(figures: dict[str, Any], drill: dict[str, Any]) -> None:
    db = figures["database"]
    assert figures["failures"] == [], "\n".join(figures["failures"])
    assert (db["lost"], db["duplicated"], db["out_of_order"], db["non_terminal"], db["cross_tenant_sql"]) == (0,) * 5
    assert db["stored"] == db["accepted"] == figures["summary"]["planned"] == drill["episodes"]
    assert db["consolidation_status"] == {"consolidated": drill["episodes"]}
    assert figures["isolation"]["leaks"] == 0 and all(figures["isolation"]["own_marker_hits"].values())


def assert_host_a_was_taken_out_mid_work(
    fleet: Fleet, figures: dict[str, Any], tenant_ids: list[str], drill: str
) -> None:
    events = [e["event"] for e in figures["events"]]
    assert events[:2] == [f"{drill}_break", f"{drill}_down"]
    killed = fleet.killed
    assert killed["host"] == "host-a"
    # caught mid-work: a backend of host-a held the apply or consolidation lock of one of the run's keys
    in_flight = keys_of_locks(killed["held_locks"], tenant_ids)
    assert in_flight, f"host-a held no lock of the run's keys when taken out: {killed['held_locks']}, {killed['look']}"
    # PostgreSQL let go of the host: its sessions (and their locks) are gone (at once when its processes died and
    # their sockets closed; within DEAD_CLIENT_S when it was cut off: keepalives and tcp_user_timeout)
    poll(lambda: fleet.backends("host-a") == 0, deadline_s=DEAD_CLIENT_S + 20, what="host-a's sessions to end")
    # the work host-a held went to host-b: each such key got applies or consolidations from host-b after the kill
    for tenant_id, butler in in_flight:
        after = rows(
            fleet,
            """
            SELECT actor AS worker FROM memory_events WHERE tenant_id = :t AND event_type = 'episode.stored'
              AND payload->>'butler' = :b AND occurred_at > :at
            UNION SELECT worker FROM consolidation_runs WHERE tenant_id = :t AND butler = :b AND started_at > :at""",
            t=tenant_id,
            b=butler,
            at=killed["at"],
        )
        assert {host_of(r.worker) for r in after} == {"host-b"}, (tenant_id, butler, after)
    print(f"{drill}: host-a (pids {killed['pids']}) held the locks of {sorted(in_flight)}; host-b took them over")
    # and the survivor is the only host still answering, on every queue
    assert fleet.active_queues() == {"host-b": {*shard_queues(SHARDS), MAINTENANCE_QUEUE}}


def assert_every_queue_served_and_order_kept(fleet: Fleet, tenant_ids: list[str], drill: dict[str, Any]) -> None:
    stored = rows(
        fleet,
        """
        SELECT tenant_id, payload->>'butler' AS butler, (payload->>'seq')::bigint AS seq, actor, occurred_at
        FROM memory_events WHERE tenant_id = ANY(:ts) AND event_type = 'episode.stored' ORDER BY id""",
        ts=tenant_ids,
    )
    assert len(stored) == drill["episodes"]  # stored exactly once each
    by_key: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for row in stored:
        by_key[(row.tenant_id, row.butler)].append(row)
    # every shard queue carried keys, and all of them were applied (the keys cover every queue by construction)
    assert {queue_for(t, b, SHARDS) for t, b in by_key} == set(shard_queues(SHARDS))
    # both hosts worked (applied or consolidated: which a host gets is Redis's choice) before the kill; only host-b
    # after it
    work = [(row.tenant_id, row.butler, host_of(row.actor), row.occurred_at) for row in stored] + [
        (run.tenant_id, run.butler, host_of(run.worker), run.started_at)
        for run in rows(fleet, "SELECT * FROM consolidation_runs WHERE tenant_id = ANY(:ts)", ts=tenant_ids)
    ]
    killed_at = fleet.killed["at"]
    assert {host for *_, host, at in work if at < killed_at} == {"host-a", "host-b"}
    assert {host for *_, host, at in work if at > killed_at} == {"host-b"}
    # per-key order across hosts: within each key, episodes were applied in seq order, whoever applied them
    for key, events in by_key.items():
        seqs = [r.seq for r in events]
        assert seqs == sorted(seqs), key
    hosts_of: dict[tuple[str, str], set[str]] = defaultdict(set)
    for tenant_id, butler, host, _ in work:
        hosts_of[(tenant_id, butler)].add(host)
    handed_over = [key for key, hosts in hosts_of.items() if hosts == {"host-a", "host-b"}]
    assert handed_over, "no key was worked on by both hosts: the handover was not exercised"
    print(f"{len(handed_over)} of {len(by_key)} keys were applied or consolidated by both hosts, applied in seq order")
    # consolidation: each key's runs cover disjoint, increasing seq ranges, never overlap in time, every episode once
    assert (
        rows(
            fleet,
            """
        SELECT count(*) AS n FROM (
            SELECT first_seq, lag(last_seq) OVER (PARTITION BY tenant_id, butler ORDER BY started_at) AS previous
            FROM consolidation_runs WHERE tenant_id = ANY(:ts)) x
        WHERE first_seq <= previous""",
            ts=tenant_ids,
        )[0].n
        == 0
    )
    assert (
        rows(
            fleet,
            """
        SELECT count(*) AS n FROM consolidation_runs a JOIN consolidation_runs b
          ON a.tenant_id = b.tenant_id AND a.butler = b.butler AND a.id < b.id
        WHERE tstzrange(a.started_at, a.finished_at, '[]') && tstzrange(b.started_at, b.finished_at, '[]')
          AND a.tenant_id = ANY(:ts)""",
            ts=tenant_ids,
        )[0].n
        == 0
    )
    assert (
        rows(fleet, "SELECT sum(episode_count) AS n FROM consolidation_runs WHERE tenant_id = ANY(:ts)", ts=tenant_ids)[
            0
        ].n
        == drill["episodes"]
    )
