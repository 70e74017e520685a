"""The second-stage reranker: its plumbing and ordering contract, with a tiny cross-encoder the test builds itself
(no weights ship with the project; the model is random, so only the contract is asserted, not quality)."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest
from sqlalchemy import text

from shared import writes
from shared.config import load_settings
from shared.db import unit_of_work
from shared.embedding import get_embedder, get_token_counter, model_dir
from shared.reads import Reader
from shared.rerank import CrossEncoderReranker, rerank
from shared.schemas import FactWrite
from shared.writes import ALL, Actor


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    path = tmp_path_factory.mktemp("cross-encoder")
    config = BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_labels=1
    )
    BertForSequenceClassification(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(str(model_dir()), local_files_only=True).save_pretrained(path)
    return path


def test_rerank_orders_the_head_by_the_model_and_leaves_the_tail(tiny_cross_encoder):
    model = CrossEncoderReranker(tiny_cross_encoder)
    items = [f"memory number {i} about {w}" for i, w in enumerate("tea coffee garden trip dentist bike car".split())]
    out = rerank("what do I drink?", items, text=str, reranker=model, top_n=4)
    scores = model.scores("what do I drink?", items[:4])
    assert out[:4] == [items[i] for i in sorted(range(4), key=lambda i: -scores[i])]
    assert out[4:] == items[4:]


def test_search_applies_the_configured_reranker_to_its_top_hits(engine, tiny_cross_encoder):
    # given a tenant with a dozen facts and a front configured with the reranker on its top 5
    tenant = f"t-{uuid.uuid4().hex[:12]}"
    embedder = get_embedder()
    with unit_of_work(engine) as conn:
        conn.execute(text("INSERT INTO tenants (id) VALUES (:t)"), {"t": tenant})
        for i in range(12):
            write = FactWrite(subject="user", predicate=f"trip_{i}", content=f"The user plans trip {i} to the coast")
            writes.store_fact(
                conn,
                tenant_id=tenant,
                fact_id=uuid.uuid4(),
                write=write,
                vector=embedder.embed_one(write.content),
                embedding_version_id=None,
                source_butler=None,
                actor=Actor("test"),
                now=datetime.now(timezone.utc),
            )
    plain = load_settings()
    ranked = load_settings(
        memory={
            "retrieval": {"reranker": "cross-encoder", "reranker_path": str(tiny_cross_encoder), "reranker_top_n": 5}
        }
    )

    def search(settings) -> list:  # noqa: ANN001
        reader = Reader(
            engine=engine, settings=settings, embed=embedder.embed_one, count_tokens=get_token_counter().count_many
        )
        return reader.search(
            tenant_id=tenant,
            visibility=ALL,
            query="trips to the coast",
            types=["fact"],
            mode="hybrid",
            limit=10,
            min_confidence=None,
        )

    # when the same search runs without and with it
    first, second = search(plain), search(ranked)
    # then the top 5 are the same hits in the model's order, and the rest are untouched
    scores = CrossEncoderReranker(tiny_cross_encoder).scores("trips to the coast", [h.content for h in first[:5]])
    assert [h.id for h in second[:5]] == [first[i].id for i in sorted(range(5), key=lambda i: -scores[i])]
    assert [h.id for h in second[5:]] == [h.id for h in first[5:]]


def test_a_cross_encoder_without_a_model_directory_is_refused_at_start():
    with pytest.raises(Exception, match="reranker_path"):
        load_settings(memory={"retrieval": {"reranker": "cross-encoder", "reranker_path": "/nonexistent"}})
