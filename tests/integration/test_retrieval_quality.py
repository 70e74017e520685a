"""The retrieval-quality benchmark's own set and claim, checked in the suite (tests/bench/bench_retrieval.py prints it).

Hybrid must be at least as good as the better single mode on every class and metric, with no tolerance. (The
keyword floor of the fusion is what keeps it so on paraphrases: at 0.5, "how do they get to work?" let an unrelated
"Gets hives …" in on its one matching word and moved the answer one rank down; see shared/retrieval.py.)"""

from __future__ import annotations

from tests.bench.bench_retrieval import evaluate


def test_hybrid_is_at_least_as_good_as_the_better_single_mode_on_each_question_class(engine):
    results = evaluate(engine)
    assert set(results) == {"paraphrase", "keyword", "mixed"}
    for kind, by_mode in results.items():
        for metric in ("recall@1", "recall@5", "recall@10", "ndcg@10"):
            best_single = max(by_mode["semantic"][metric], by_mode["keyword"][metric])
            assert by_mode["hybrid"][metric] >= best_single, (kind, metric, by_mode)
    # and the modes really differ: each single mode has a class it is clearly worse at
    assert results["paraphrase"]["keyword"]["recall@1"] < 0.5 < results["paraphrase"]["semantic"]["recall@1"]
