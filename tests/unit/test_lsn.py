"""WAL positions, the write ledger and the lag clock: pure, with the clock passed in."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.lsn import LagClock, WriteLedger, format_lsn, parse_lsn


def test_lsn_text_orders_like_the_wal():
    assert parse_lsn("0/0") == 0
    assert parse_lsn("16/B374D848") == (0x16 << 32) | 0xB374D848
    # the low half is not zero-padded: comparing the strings would be wrong, the integers are not
    assert parse_lsn("0/A0000000") > parse_lsn("0/9FFFFFFF")
    assert parse_lsn("1/0") > parse_lsn("0/FFFFFFFF")


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_lsn_round_trips(value):
    assert parse_lsn(format_lsn(value)) == value


def test_not_an_lsn_is_refused():
    with pytest.raises(ValueError):
        parse_lsn("12345")


def test_ledger_floor_is_the_highest_lsn_of_the_named_keys():
    ledger = WriteLedger(ttl_s=10)
    ledger.note(["id:a", "request:r1"], 100, now=0)
    ledger.note(["id:b", "request:r1"], 250, now=1)
    assert ledger.floor(["id:a"], now=2) == 100
    assert ledger.floor(["request:r1"], now=2) == 250
    assert ledger.floor(["id:a", "id:b"], now=2) == 250
    # a read naming nothing this process wrote may go anywhere
    assert ledger.floor(["id:zzz", None], now=2) is None
    assert ledger.floor([], now=2) is None


def test_ledger_entries_expire_after_the_ttl():
    ledger = WriteLedger(ttl_s=10)
    ledger.note(["id:a"], 100, now=0)
    assert ledger.floor(["id:a"], now=9.9) == 100
    assert ledger.floor(["id:a"], now=10.0) is None
    assert len(ledger) == 0


def test_a_key_written_again_keeps_the_higher_lsn_and_the_later_expiry():
    ledger = WriteLedger(ttl_s=10)
    ledger.note(["token:t"], 500, now=0)
    ledger.note(["token:t"], 300, now=5)  # an older position noted late (threads finish out of order)
    assert ledger.floor(["token:t"], now=12) == 500


def test_an_evicted_entry_still_counts_until_it_would_have_expired():
    # given a ledger of two entries and a third write
    ledger = WriteLedger(ttl_s=10, max_entries=2)
    ledger.note(["id:a"], 900, now=0)
    ledger.note(["id:b"], 100, now=1)
    ledger.note(["id:c"], 200, now=2)
    assert len(ledger) == 2
    # then a read naming the evicted id still needs its position (erring towards the primary)
    assert ledger.floor(["id:a"], now=3) == 900
    # and so does any read naming a key, since the evicted one might be it
    assert ledger.floor(["id:c"], now=3) == 900
    # a read naming nothing needs nothing
    assert ledger.floor([None], now=3) is None
    # once the evicted entry would have expired, the floor is the kept entries' again
    assert ledger.floor(["id:c"], now=10.5) == 200


def test_lag_is_zero_when_the_replica_has_what_the_primary_had():
    clock = LagClock()
    clock.sample(100, now=0)
    assert clock.lag(100, now=50) == 0
    assert clock.lag(150, now=50) == 0


def test_an_idle_primary_shows_no_lag_however_old_its_last_write():
    # given a primary that wrote at t=0 and nothing for an hour
    clock = LagClock()
    for t in range(0, 3600, 60):
        clock.sample(100, now=t)
    # when a write lands and the replica has not replayed it a second later
    clock.sample(120, now=3600)
    # then the lag is that second, not the hour since the previous write
    assert clock.lag(100, now=3601) == pytest.approx(1.0)


def test_a_stuck_replica_lags_by_the_time_since_the_primary_first_had_what_it_lacks():
    clock = LagClock()
    clock.sample(100, now=0)
    clock.sample(200, now=10)
    clock.sample(300, now=20)
    assert clock.lag(100, now=30) == pytest.approx(20.0)  # missing what the primary had at t=10
    assert clock.lag(250, now=30) == pytest.approx(10.0)  # missing only what it had at t=20
    assert clock.lag(300, now=30) == 0.0


def test_old_samples_beyond_the_horizon_are_dropped_but_the_lag_stays_at_least_the_horizon():
    clock = LagClock(horizon_s=100)
    for t in range(0, 1000, 10):
        clock.sample(t + 1, now=t)
    assert clock.lag(0, now=1000) >= 100
    assert len(clock._samples) < 20  # noqa: SLF001 - the memory bound is the point
