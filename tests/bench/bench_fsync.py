"""How long a durable commit can wait on a disk: fdatasync after an 8 kB write, as PostgreSQL flushes its WAL.

    python tests/bench/bench_fsync.py [--dir PATH] [--rate 200] [--seconds 30]

Every accepted write is a commit that waits for the WAL to reach the disk, so the slowest flushes are the floor of
the accepts' p99: a flush that stalls for 100 ms holds every accept of that moment (50 of them at 500 accepts/s).
This writes 8 kB and calls fdatasync --rate times a second for --seconds in a scratch file under --dir (put it
on the disk of PostgreSQL's pg_wal; the file is removed after), and prints the percentiles, the slowest flush and
how many flushes took longer than 10, 20 and 50 ms.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.common import reference_line, run_benchmark  # noqa: E402

BLOCK = 8192
SPAN = 16 << 20  # a WAL segment's size: the writes cycle over it, as PostgreSQL fills a segment
STALLS_MS = (10, 20, 50)


def flush_times(directory: Path, rate: float, seconds: float) -> list[float]:
    """Seconds each fdatasync took, paced at ``rate`` (a flush that stalls delays the next ones, never skips them)."""
    out: list[float] = []
    block = os.urandom(BLOCK)
    with tempfile.NamedTemporaryFile(dir=directory, prefix="bench-fsync-") as scratch:
        fd, n, t0 = scratch.fileno(), int(rate * seconds), time.monotonic()
        for i in range(n):
            os.pwrite(fd, block, (i * BLOCK) % SPAN)
            start = time.perf_counter()
            os.fdatasync(fd)
            out.append(time.perf_counter() - start)
            wait = t0 + (i + 1) / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path("."), help="a directory on the disk to test (default .)")
    parser.add_argument("--rate", type=float, default=200.0, help="flushes per second (default 200)")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long (default 30)")
    args = parser.parse_args()
    times = sorted(flush_times(args.dir, args.rate, args.seconds))

    def pct(p: float) -> float:
        return 1000 * times[min(len(times) - 1, int(len(times) * p / 100))]

    print(reference_line())
    print(
        f"fdatasync of {BLOCK // 1024} kB in {args.dir.resolve()}: {len(times)} flushes at {args.rate:g}/s; "
        f"p50 {pct(50):.2f} ms, p99 {pct(99):.2f} ms, p99.9 {pct(99.9):.2f} ms, max {1000 * times[-1]:.2f} ms"
    )
    print("flushes slower than " + ", ".join(f"{ms} ms: {sum(t * 1000 > ms for t in times)}" for ms in STALLS_MS))
    return 0


if __name__ == "__main__":
    run_benchmark(main)
