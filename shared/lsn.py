"""WAL positions, pure: parse PostgreSQL's ``X/Y`` LSNs, remember recent writes' LSNs, and measure a replica's lag.

No I/O and no clock: every function takes ``now`` (monotonic seconds) as an argument. The read plane
(:mod:`shared.replicas`) feeds them what it reads from the primary and the replicas.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable

# A write whose LSN could not be read after its commit: no replica is known to hold it, so its reads go to the
# primary until the entry expires.
UNKNOWN_LSN = 2**64 - 1


def parse_lsn(value: str) -> int:
    """``'16/B374D848'`` (pg_lsn's text form) as an integer that orders like the WAL."""
    high, _, low = value.partition("/")
    if not low:
        raise ValueError(f"not an LSN: {value!r}")
    return (int(high, 16) << 32) | int(low, 16)


def format_lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


class WriteLedger:
    """The LSN at which this process's recent writes were durable, by key (an accepted id, a request_id, a token).

    A read that names one of those keys must see the write, so it needs a server that has replayed that far.
    Entries expire after ``ttl_s`` (by then any replica inside the lag bound holds them). At most
    ``max_entries`` are kept; an entry evicted early still counts, for every key, until it would have expired:
    the floor errs towards the primary, never towards a stale answer.
    """

    def __init__(self, *, ttl_s: float, max_entries: int = 50_000) -> None:
        self.ttl_s, self.max_entries = ttl_s, max_entries
        self._entries: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self._evicted: tuple[int, float] = (0, float("-inf"))  # the highest evicted LSN and when it expires

    def note(self, keys: Iterable[str], lsn: int, *, now: float) -> None:
        expires = now + self.ttl_s
        for key in keys:
            old = self._entries.pop(key, None)
            self._entries[key] = (max(lsn, old[0]) if old else lsn, expires)
        self._expire(now)
        while len(self._entries) > self.max_entries:
            _, (lsn_, expires_) = self._entries.popitem(last=False)
            top, until = self._evicted
            self._evicted = (max(top, lsn_) if until > now else lsn_, max(until, expires_))

    def floor(self, keys: Iterable[str | None], *, now: float) -> int | None:
        """The WAL position a read naming ``keys`` needs, or None when no recent write of this process matters."""
        self._expire(now)
        named = [key for key in keys if key is not None]
        found = [self._entries[key][0] for key in named if key in self._entries]
        if named and self._evicted[1] > now:  # a named key may be one of the evicted
            found.append(self._evicted[0])
        return max(found) if found else None

    def __len__(self) -> int:
        return len(self._entries)

    def _expire(self, now: float) -> None:
        while self._entries:
            key, (_, expires) = next(iter(self._entries.items()))
            if expires > now:
                break
            del self._entries[key]


class LagClock:
    """A replica's lag as the age of the oldest primary WAL position it has not replayed yet.

    ``sample`` records the primary's current LSN at ``now``; ``lag`` answers "since when has the primary held WAL
    this replica lacks?" An idle primary therefore shows no lag however old its last commit is, a paused or
    disconnected replica's lag grows with the clock, and no two hosts' clocks are compared (only this process's).
    The answer is exact to one sampling interval.
    """

    def __init__(self, *, horizon_s: float = 3600.0, max_samples: int = 4096) -> None:
        self.horizon_s = horizon_s
        self._samples: deque[tuple[float, int]] = deque(maxlen=max_samples)

    def sample(self, primary_lsn: int, *, now: float) -> None:
        if self._samples and self._samples[-1][1] == primary_lsn:
            return  # nothing new was written: the oldest sample at this position already says since when
        self._samples.append((now, primary_lsn))
        # Keep one sample older than the horizon so a replica stuck for longer still shows at least the horizon.
        while len(self._samples) > 1 and self._samples[1][0] < now - self.horizon_s:
            self._samples.popleft()

    def lag(self, replay_lsn: int, *, now: float) -> float:
        """Seconds since the primary first held WAL beyond ``replay_lsn`` (0 when the replica has all it had)."""
        for at, lsn in self._samples:  # oldest first: the first sample ahead of the replica says since when
            if lsn > replay_lsn:
                return max(0.0, now - at)
        return 0.0
