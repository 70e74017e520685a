"""What the front's broker wake-up publisher costs per accept, with and without the gap between its rounds.

    python tests/bench/bench_publisher.py [--rate 400] [--keys 16] [--seconds 8]

Offers apply wake-ups as a front's accepts do (memory_workers.enqueue.Publisher.wake_apply), paced at --rate over
--keys (tenant, butler) keys, against the benchmarks' Redis database (flushed before and after; no worker takes the
wake-ups, so after the first round every key's marker says one waits, as under a burst). Runs once with rounds back
to back (gap 0, the publisher before issue 14's change) and once with the default gap, and prints for each the
process CPU per offer over what the pacing loop alone costs, and the rounds per second.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from memory_workers.enqueue import ROUND_GAP_S, Publisher  # noqa: E402
from shared.config import load_settings  # noqa: E402
from tests.bench.common import BENCH_REDIS_URL, bench_redis, reference_line, run_benchmark  # noqa: E402


def paced(rate: float, seconds: float, offer: Callable[[int], object] | None = None) -> tuple[int, float, float]:
    """Calls ``offer(i)`` ``rate`` times a second for ``seconds``: (calls, process CPU s, wall s)."""
    n = int(rate * seconds)
    cpu0, t0 = time.process_time(), time.monotonic()
    for i in range(n):
        if offer is not None:
            offer(i)
        wait = t0 + (i + 1) / rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
    return n, time.process_time() - cpu0, time.monotonic() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=400, help="offers per second")
    parser.add_argument("--keys", type=int, default=16, help="distinct (tenant, butler) keys")
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--redis-url", default=BENCH_REDIS_URL, help="flushed before and after")
    args = parser.parse_args()
    print(reference_line())
    keys = [(f"bench-t{i % 4}", f"b{i // 4}") for i in range(args.keys)]
    with bench_redis(args.redis_url) as url:
        settings = load_settings(redis_url=url)
        _, loop_cpu, loop_wall = paced(args.rate, args.seconds)
        print(f"pacing loop alone: {loop_cpu / loop_wall:.3f} cores")
        for gap in (0.0, ROUND_GAP_S):
            with redis.Redis.from_url(url) as client:
                client.flushdb()  # each run starts with no key marked
            publisher = Publisher(settings, round_gap_s=gap)
            try:
                n, cpu, wall = paced(args.rate, args.seconds, lambda i: publisher.wake_apply(*keys[i % len(keys)]))
                if not publisher.flush(10):
                    print("the publisher did not flush within 10 s")
                    return 1
            finally:
                publisher.close()
            stats = publisher.snapshot()
            extra = cpu - loop_cpu * wall / loop_wall
            print(
                f"gap {gap * 1000:.0f} ms: {1000 * extra / n:.3f} ms of CPU per offer ({extra / wall:.3f} cores), "
                f"{stats['rounds'] / wall:.0f} rounds/s; {n} offers, {stats['published']} published, "
                f"{stats['coalesced']} coalesced, {stats['dropped'] + stats['failed']} dropped or failed"
            )
    return 0


if __name__ == "__main__":
    run_benchmark(main)
