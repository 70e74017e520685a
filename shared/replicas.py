"""The read plane (seed 001 §8.3): reads on streaming replicas, writes on the primary, read-your-writes by LSN.

A :class:`ReadPlane` holds the primary's engine and one :class:`Replica` per URL in ``DATABASE_READ_URL``. A
watch thread per replica reads, every ``check_interval_seconds``, the primary's ``pg_current_wal_lsn()`` and the
replica's ``pg_is_in_recovery()`` and ``pg_last_wal_replay_lsn()``; from those it knows the replica's lag
(:class:`shared.lsn.LagClock`). A read goes to a replica that answers, is in recovery and lags at most
``max_lag_seconds``, in turn; otherwise to the primary (reads fail open, never to an error).

Read-your-writes: after a write commits, the front notes ``pg_current_wal_lsn()`` under the write's keys (the
accepted ids, the caller's request_id, the token). A read naming one of those keys needs a replica whose
``pg_last_wal_replay_lsn()`` has reached it: the last check's answer, else one query on the replica, else the
primary. No sleeping, no waiting for a replica to catch up.

With no replicas configured the plane is the primary and adds nothing to any call.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, TimeoutError as PoolTimeout

from shared import db
from shared.lsn import UNKNOWN_LSN, LagClock, WriteLedger, parse_lsn

log = logging.getLogger(__name__)

_planes: weakref.WeakSet[ReadPlane] = weakref.WeakSet()  # this process's planes, for the gauges


@dataclass(frozen=True)
class ReplicaStatus:
    """What the last check of a replica saw; ``checked_at`` is monotonic seconds."""

    label: str
    up: bool = False
    replay_lsn: int | None = None
    lag_s: float | None = None
    checked_at: float = float("-inf")
    reason: str | None = "not checked yet"


def replica_label(url: str) -> str:
    """``host:port/database`` (or the socket directory): names a replica in logs and gauges, without credentials."""
    parsed = make_url(db.normalise_url(url))
    host = parsed.host or parsed.query.get("host") or "localhost"
    return f"{host}:{parsed.port or 5432}/{parsed.database or ''}"


class Replica:
    """One streaming replica: its engine and what its watch saw last (replaced whole, so readers need no lock)."""

    def __init__(
        self, url: str, *, primary: Engine, pool_size: int, connect_timeout_s: int, session_settings: str | None = None
    ) -> None:
        self.label = replica_label(url)
        # Kept, not overflowing: an overflow connection would be closed on its return (memory_api/tools/services.py).
        self.engine = db.make_engine(
            url,
            pool_size=pool_size,
            max_overflow=0,
            connect_timeout_s=connect_timeout_s,
            session_settings=session_settings,
        )
        self.status = ReplicaStatus(label=self.label)
        self._primary = primary
        self._clock = LagClock()
        self._clock_lock = threading.Lock()  # the watch samples while request threads may ask for the lag
        self._lock = threading.Lock()

    def check(self) -> ReplicaStatus:
        """One round: the primary's WAL position, then how far the replica has replayed; returns the new status."""
        try:
            with self._primary.connect() as conn:
                primary_lsn = parse_lsn(conn.execute(text("SELECT pg_current_wal_lsn()::text")).scalar_one())
            with self._clock_lock:
                self._clock.sample(primary_lsn, now=time.monotonic())
        except Exception as exc:  # noqa: BLE001 - a primary that does not answer leaves the lag as it was
            log.debug("read plane: primary WAL position unavailable", extra={"error": type(exc).__name__})
        try:
            with self.engine.connect() as conn:
                row = conn.execute(text("SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text")).one()
                in_recovery: bool = row[0]
                replay: str | None = row[1]
        except Exception as exc:  # noqa: BLE001 - any failure means: read elsewhere
            return self.mark_down(f"unreachable: {type(exc).__name__}")
        if not in_recovery or replay is None:
            return self.mark_down("not in recovery: a primary, not a replica (reads there could go backwards)")
        lsn, now = parse_lsn(replay), time.monotonic()
        return self._set(
            ReplicaStatus(
                label=self.label, up=True, replay_lsn=lsn, lag_s=self._lag(lsn, now), checked_at=now, reason=None
            )
        )

    def mark_down(self, reason: str) -> ReplicaStatus:
        old = self.status
        if old.up or old.reason != reason:
            log.warning("read plane: replica not serving reads", extra={"replica": self.label, "reason": reason})
        lag = None if old.replay_lsn is None else self._lag(old.replay_lsn, time.monotonic())
        return self._set(replace(old, up=False, lag_s=lag, checked_at=time.monotonic(), reason=reason))

    def _lag(self, replay_lsn: int, now: float) -> float:
        with self._clock_lock:
            return self._clock.lag(replay_lsn, now=now)

    def saw_replay(self, lsn: int) -> None:
        """A read found the replica this far on: later reads need not ask again."""
        with self._lock:
            if self.status.replay_lsn is None or lsn > self.status.replay_lsn:
                self.status = replace(self.status, replay_lsn=lsn)

    def _set(self, status: ReplicaStatus) -> ReplicaStatus:
        with self._lock:
            if self.status.replay_lsn is not None and status.replay_lsn is not None:
                status = replace(status, replay_lsn=max(status.replay_lsn, self.status.replay_lsn))
            self.status = status
        return status


class ReadPlane:
    """Where a read goes: a usable replica in turn, or the primary. Made once per front process."""

    def __init__(
        self,
        *,
        primary: Engine,
        replica_urls: Sequence[str] = (),
        max_lag_s: float = 10.0,
        check_interval_s: float = 1.0,
        pool_size: int = 5,
        connect_timeout_s: int = 3,
        session_settings: str | None = None,
    ) -> None:
        """``session_settings``: what every replica connection runs once (as the primary's read pool does)."""
        self.primary = primary
        self.max_lag_s, self.check_interval_s, self.connect_timeout_s = max_lag_s, check_interval_s, connect_timeout_s
        # A status older than this vouches for nothing (the watch is stuck on a replica that stopped answering).
        self.stale_after_s = max(3 * check_interval_s, 3.0)
        self.replicas = [
            Replica(
                url,
                primary=primary,
                pool_size=pool_size,
                connect_timeout_s=connect_timeout_s,
                session_settings=session_settings,
            )
            for url in replica_urls
        ]
        # Once a write's entry expires, any replica inside the bound has replayed it.
        self.ledger = WriteLedger(ttl_s=max_lag_s + self.stale_after_s + check_interval_s)
        self._ledger_lock = threading.Lock()
        self._turn = itertools.count()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        _planes.add(self)

    def start(self) -> None:
        """Watch each replica in a daemon thread; wait (a bounded time) for the first checks, so the first reads
        may use the replicas. A replica that hangs does not hold the front's start: its reads go to the primary."""
        first = []
        for replica in self.replicas:
            checked = threading.Event()
            thread = threading.Thread(
                target=self._watch, args=(replica, checked), daemon=True, name=f"replica-watch-{replica.label}"
            )
            thread.start()
            self._threads.append(thread)
            first.append(checked)
        deadline = time.monotonic() + self.connect_timeout_s + 1.0
        for checked in first:
            checked.wait(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        for replica in self.replicas:
            replica.engine.dispose()
        _planes.discard(self)

    def _watch(self, replica: Replica, checked: threading.Event) -> None:
        replica.check()
        checked.set()
        while not self._stop.wait(self.check_interval_s):
            replica.check()

    def usable(self, status: ReplicaStatus, now: float) -> bool:
        return (
            status.up
            and now - status.checked_at <= self.stale_after_s
            and status.lag_s is not None
            and status.lag_s <= self.max_lag_s
        )

    # -- read-your-writes -------------------------------------------------------------------------------------
    def note_write(self, keys: Iterable[str | None]) -> None:
        """After a commit: remember the primary's WAL position under ``keys`` (one query; none without replicas)."""
        if not self.replicas:
            return
        try:
            with self.primary.connect() as conn:
                lsn = parse_lsn(conn.execute(text("SELECT pg_current_wal_lsn()::text")).scalar_one())
        except Exception:  # noqa: BLE001 - the write is committed; its reads simply go to the primary
            log.warning("read plane: WAL position after a write unavailable", exc_info=True)
            lsn = UNKNOWN_LSN
        with self._ledger_lock:
            self.ledger.note([k for k in keys if k is not None], lsn, now=time.monotonic())

    def floor(self, keys: Iterable[str | None]) -> int | None:
        """The WAL position a read naming ``keys`` must see (None: any usable replica will do)."""
        if not self.replicas:
            return None
        with self._ledger_lock:
            return self.ledger.floor(keys, now=time.monotonic())

    # -- routing ----------------------------------------------------------------------------------------------
    def connect(self, *, floor: int | None = None) -> Connection:
        """A connection for one read: a usable replica that has replayed ``floor``, else the primary's."""
        now = time.monotonic()
        usable = [r for r in self.replicas if self.usable(r.status, now)]
        if usable:
            start = next(self._turn) % len(usable)
            for replica in usable[start:] + usable[:start]:
                conn = self._replica_connection(replica, floor)
                if conn is not None:
                    return conn
        return self.primary.connect()

    def _replica_connection(self, replica: Replica, floor: int | None) -> Connection | None:
        try:
            conn = replica.engine.connect()
        except (DBAPIError, PoolTimeout) as exc:  # it died since the last check: tell the others, read elsewhere
            replica.mark_down(f"unreachable: {type(exc).__name__}")
            return None
        known = replica.status.replay_lsn
        if floor is None or (known is not None and known >= floor):
            return conn
        try:
            replay = conn.execute(text("SELECT pg_last_wal_replay_lsn()::text")).scalar()
            conn.rollback()  # end the implicit transaction: the read sets its own isolation level
        except DBAPIError as exc:
            conn.close()
            replica.mark_down(f"unreachable: {type(exc).__name__}")
            return None
        if replay is not None:
            replica.saw_replay(parse_lsn(replay))
        if replay is not None and parse_lsn(replay) >= floor:
            return conn
        conn.close()
        return None

    def statuses(self) -> list[ReplicaStatus]:
        return [replica.status for replica in self.replicas]


def replica_lag_seconds() -> dict[str, float]:
    """Each replica's lag in seconds, as this process measures it (for the ``memory_butler_replica_lag_seconds``
    gauge); a replica never seen answering has no entry."""
    return {s.label: round(s.lag_s, 3) for plane in list(_planes) for s in plane.statuses() if s.lag_s is not None}


def replica_up() -> dict[str, int]:
    """1 for each replica answering as a replica at its last check, else 0 (``memory_butler_replica_up``)."""
    return {s.label: int(s.up) for plane in list(_planes) for s in plane.statuses()}
