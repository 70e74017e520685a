"""The read plane against the suite's own server: a URL that is not a replica, or not there at all, serves no
reads (they go to the primary), and the write ledger asks the primary for its WAL position after a commit."""

from __future__ import annotations

from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from shared.lsn import parse_lsn
from shared.replicas import ReadPlane


def test_a_primary_given_as_a_replica_serves_no_reads(engine: Engine, database_url: str):
    # given DATABASE_READ_URL pointing at a server that is not in recovery (a primary: reads could go backwards)
    plane = ReadPlane(primary=engine, replica_urls=[database_url], check_interval_s=60)
    try:
        plane.start()
        (status,) = plane.statuses()
        # then it is reported down with the reason, and reads use the primary's engine
        assert status.up is False and "not in recovery" in status.reason
        with plane.connect() as conn:
            assert conn.engine is engine
    finally:
        plane.close()


def test_an_unreachable_replica_serves_no_reads_and_has_no_lag_until_seen(engine: Engine, database_url: str):
    # given a replica URL nobody listens on
    nowhere = make_url(database_url).set(host="127.0.0.1", port=1, query={}).render_as_string(hide_password=False)
    plane = ReadPlane(primary=engine, replica_urls=[nowhere], check_interval_s=60, connect_timeout_s=1)
    try:
        plane.start()
        (status,) = plane.statuses()
        assert status.up is False and status.reason.startswith("unreachable")
        assert status.lag_s is None and status.label == "127.0.0.1:1/" + make_url(database_url).database
        with plane.connect(floor=10**12) as conn:
            assert conn.engine is engine
    finally:
        plane.close()


def test_a_write_is_remembered_at_the_primarys_wal_position_after_its_commit(engine: Engine, database_url: str):
    # given a plane with a replica configured (the ledger is only kept when there is one)
    plane = ReadPlane(primary=engine, replica_urls=[database_url], check_interval_s=60)
    try:
        with engine.connect() as conn:
            before = parse_lsn(conn.execute(text("SELECT pg_current_wal_lsn()::text")).scalar_one())
        # when a write commits and is noted
        with engine.begin() as conn:
            conn.execute(text("CREATE TEMP TABLE IF NOT EXISTS t_ledger (a int)"))
            conn.execute(text("SELECT txid_current()"))  # a transaction id: its commit writes WAL
        plane.note_write(["id:a", "request:r1", None])
        # then a read naming it needs at least the position the commit reached; other reads need nothing
        assert plane.floor(["id:a"]) >= before
        assert plane.floor(["request:r1"]) == plane.floor(["id:a"])
        assert plane.floor(["id:b"]) is None
    finally:
        plane.close()
