"""The fuzzing campaign as a command (issue 16 §E): N calls through the real MCP client to a real front.

    python tests/bench/bench_fuzz.py --calls 10000 [--seed N] [--database-url URL] [--redis-url URL]

Starts `memory-butler serve` on a free port (on a fresh database on the embedded server, or --database-url),
seeds two tenants through it, then sends --calls calls drawn from each tool's inputSchema and hostile values
(tests/bench/fuzz_campaign.py says what each answer counts as). Prints the counts per tool and overall, the
first example of each failure, and the machine-speed reference line; exits 1 if any count that must be 0 is not.
Its Redis database (default redis://127.0.0.1:6379/9, or BENCH_FUZZ_REDIS_URL) is flushed before and after.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.common import bench_engine, bench_redis, reference_line, run_benchmark  # noqa: E402
from tests.bench.fuzz_campaign import Campaign  # noqa: E402
from tests.bench.fuzz_world import FrontProcess, log_crashes, seed_tenants  # noqa: E402

FUZZ_REDIS_URL = os.environ.get("BENCH_FUZZ_REDIS_URL", "redis://127.0.0.1:6379/9")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: derandomised)")
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--redis-url", default=FUZZ_REDIS_URL)
    args = parser.parse_args(argv)

    log_path = Path(tempfile.mkdtemp(prefix="mb-fuzz-")) / "front.log"
    with bench_redis(args.redis_url) as redis_url, bench_engine(args.database_url) as engine:
        database_url = engine.url.render_as_string(hide_password=False)
        front = FrontProcess(database_url, redis_url, log_path).start()
        try:
            a, b = seed_tenants(engine, front.url, database_url, redis_url)
            campaign = Campaign(engine, front, a, b)
            started = time.perf_counter()
            with campaign.running():
                tally = campaign.run(args.calls, args.seed)
            campaign.finish()
            elapsed = time.perf_counter() - started
        finally:
            front.stop()
    total = tally.total
    print(
        f"fuzz: {total['calls']} calls in {elapsed:.0f} s ({total['calls'] / elapsed:.1f}/s), seed "
        f"{args.seed if args.seed is not None else 'derandomised'}; front log {log_path}"
    )
    print(tally.table())
    print(f"time: {tally.seconds['calls']:.0f} s in calls, {tally.seconds['fingerprints']:.0f} s in fingerprints")
    print(f"front log: {log_crashes(log_path)} 'tool crashed' tracebacks")
    for kind, example in tally.first.items():
        print(f"first {kind}: {example}")
    print(reference_line())
    return 1 if tally.failures() or log_crashes(log_path) else 0


if __name__ == "__main__":
    run_benchmark(main)
