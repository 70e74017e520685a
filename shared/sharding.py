"""Routing of work by (tenant, butler): a stable shard number, its queue name and a Postgres advisory-lock key.

Every process must agree on the route without talking to the others, so the hashes here are
fixed algorithms (crc32, blake2b) over a fixed encoding — never Python's ``hash()``, which is
salted per process.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass

from shared.errors import InvalidInput

# Unit separator: cannot be typed in a name, so ("a", "bc") and ("ab", "c") encode differently.
SEPARATOR = "\x1f"
MAINTENANCE_QUEUE = "maintenance"
QUEUE_PREFIX = "shard."


def _check_count(count: int) -> None:
    if count < 1:
        raise InvalidInput(f"shard count must be >= 1, got {count}", field="count")


@dataclass(frozen=True)
class ShardKey:
    """The unit of ordering: all writes of one butler of one tenant go to one shard, one lock."""

    tenant_id: str
    butler: str

    def __post_init__(self) -> None:
        # A separator inside a part would let two different keys encode to the same bytes.
        for field_name in ("tenant_id", "butler"):
            value: str = getattr(self, field_name)
            if SEPARATOR in value:
                raise InvalidInput(f"{field_name} must not contain \\x1f", field=field_name)
            # Lone surrogates have no UTF-8 form, so the key could not be hashed (or stored) at all.
            try:
                value.encode()
            except UnicodeEncodeError:
                raise InvalidInput(f"{field_name} is not valid UTF-8 text", field=field_name) from None

    def encode(self) -> bytes:
        """The stable byte form every hash here is taken over."""
        return f"{self.tenant_id}{SEPARATOR}{self.butler}".encode()

    def shard(self, count: int) -> int:
        """``crc32(key) % count``: in [0, count), identical in every process and release."""
        _check_count(count)
        return zlib.crc32(self.encode()) % count

    def queue(self, count: int) -> str:
        """The Celery queue that serialises this key's work among ``count`` shards."""
        return shard_queue(self.shard(count))

    def advisory_lock_key(self) -> int:
        """A signed 64-bit key for ``pg_advisory_xact_lock``: the first 8 bytes of blake2b(key)."""
        # 64 bits rather than crc32's 32 so unrelated keys practically never share a lock.
        digest = hashlib.blake2b(self.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big", signed=True)


def shard_queue(shard: int) -> str:
    """The queue name of a shard number."""
    return f"{QUEUE_PREFIX}{shard}"


def shard_queues(count: int) -> list[str]:
    """Every shard queue a worker pool must consume for ``count`` shards, in shard order."""
    _check_count(count)
    return [shard_queue(n) for n in range(count)]


def queue_for(tenant_id: str, butler: str, count: int) -> str:
    """The shard queue of (tenant, butler) among ``count`` shards."""
    return ShardKey(tenant_id=tenant_id, butler=butler).queue(count)
