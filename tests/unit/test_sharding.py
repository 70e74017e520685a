"""Unit tests of shared.sharding: stable routes, even spread, no separator collisions."""

from __future__ import annotations

import hashlib
import zlib
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.errors import InvalidInput
from shared.sharding import MAINTENANCE_QUEUE, ShardKey, queue_for, shard_queue, shard_queues

props = settings(deadline=None, max_examples=300)
# Lone surrogates (Cs) are excluded: they have no UTF-8 form and are refused separately.
names = st.text(alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x1f"), max_size=40)


def test_shard_numbers_are_stable_across_releases() -> None:
    # given keys whose crc32 values were computed once, outside the module
    # then the shard is that crc modulo the count: a change here would reroute live traffic
    assert zlib.crc32(b"acme\x1fops") == 2336710441
    assert ShardKey(tenant_id="acme", butler="ops").shard(8) == 1
    assert ShardKey(tenant_id="acme", butler="ops").shard(64) == 41
    assert ShardKey(tenant_id="default", butler="claude").shard(8) == 0
    assert ShardKey(tenant_id="default", butler="claude").shard(64) == 24


def test_queue_names() -> None:
    # given 8 shards
    # then the queues are shard.0 .. shard.7 and maintenance is separate
    assert queue_for("acme", "ops", 8) == "shard.1"
    assert ShardKey(tenant_id="default", butler="claude").queue(64) == "shard.24"
    assert shard_queue(3) == "shard.3"
    assert shard_queues(8) == [f"shard.{n}" for n in range(8)]
    assert MAINTENANCE_QUEUE == "maintenance"
    assert MAINTENANCE_QUEUE not in shard_queues(1024)


def test_advisory_lock_key_is_stable_signed_64_bit() -> None:
    # given a key whose blake2b-64 digest was computed once, outside the module
    key = ShardKey(tenant_id="acme", butler="ops")
    # then the lock key is that digest as a signed big-endian int64
    expected = int.from_bytes(hashlib.blake2b(b"acme\x1fops", digest_size=8).digest(), "big", signed=True)
    assert key.advisory_lock_key() == expected == 5715399565163286083
    assert ShardKey(tenant_id="a", butler="bc").advisory_lock_key() == -6302140858635145382


def test_separator_keeps_split_points_apart() -> None:
    # given two keys whose plain concatenation is the same ("abc")
    left = ShardKey(tenant_id="a", butler="bc")
    right = ShardKey(tenant_id="ab", butler="c")
    # then their encodings, hashes and lock keys differ
    assert left.encode() != right.encode()
    assert zlib.crc32(left.encode()) == 919900912
    assert zlib.crc32(right.encode()) == 4033637960
    assert left.shard(64) != right.shard(64)
    assert left.advisory_lock_key() != right.advisory_lock_key()


def test_separator_inside_a_name_is_refused() -> None:
    with pytest.raises(InvalidInput) as raised:
        ShardKey(tenant_id="a\x1fb", butler="c")
    assert raised.value.field == "tenant_id"


def test_name_without_utf8_form_is_refused() -> None:
    # given a lone surrogate, which cannot be encoded (nor stored in Postgres)
    with pytest.raises(InvalidInput) as raised:
        ShardKey(tenant_id="t", butler="\ud800")
    # then the key is refused at construction, naming the field
    assert raised.value.field == "butler"


@pytest.mark.parametrize("count", [0, -1])
def test_shard_count_must_be_positive(count: int) -> None:
    with pytest.raises(InvalidInput) as raised:
        ShardKey(tenant_id="t", butler="b").shard(count)
    assert raised.value.field == "count"
    with pytest.raises(InvalidInput):
        shard_queues(count)


@pytest.mark.parametrize(("count", "critical"), [(8, 24.32), (64, 103.4)])
def test_shards_spread_evenly(count: int, critical: float) -> None:
    # given 10,000 distinct (tenant, butler) keys
    keys = [ShardKey(tenant_id=f"tenant-{n % 100}", butler=f"butler-{n // 100}") for n in range(10_000)]
    # when each is routed among `count` shards
    load = Counter(key.shard(count) for key in keys)
    # then every shard gets work and the chi-square statistic is below its p=0.001 critical value
    expected = len(keys) / count
    chi_square = sum((load[n] - expected) ** 2 / expected for n in range(count))
    assert set(load) == set(range(count))
    assert chi_square < critical


@props
@given(tenant=names, butler=names, count=st.integers(1, 1024))
def test_routing_is_in_range_and_consistent(tenant: str, butler: str, count: int) -> None:
    # given any key and shard count
    key = ShardKey(tenant_id=tenant, butler=butler)
    # then the shard is in range, matches crc32 of the encoding, and the queue is one of the pool's
    shard = key.shard(count)
    assert 0 <= shard < count
    assert shard == zlib.crc32(f"{tenant}\x1f{butler}".encode()) % count
    assert queue_for(tenant, butler, count) in shard_queues(count)
    assert -(2**63) <= key.advisory_lock_key() < 2**63
    assert key == ShardKey(tenant_id=tenant, butler=butler)
    assert key.advisory_lock_key() == ShardKey(tenant_id=tenant, butler=butler).advisory_lock_key()
