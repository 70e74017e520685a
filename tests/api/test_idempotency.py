"""Idempotency keys (issue 16, item 4): scoped to the shard key (tenant, butler), checked against a hash of the
payload. Two butlers may use one key; a replay must carry the same write; a different payload is refused."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import Engine, text

from tests.api.conftest import Butler, Front, applied, count_rows, new_token


def _intents(engine: Engine, tenant_id: str) -> list[tuple[str, str, str]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    "SELECT butler, idempotency_key, payload_hash FROM write_intents WHERE tenant_id = :t "
                    "ORDER BY seq, butler"
                ),
                {"t": tenant_id},
            )
        ]


def test_two_butlers_with_one_key_each_get_their_own_episode(
    worker, front: Front, engine: Engine, tenant_a: str
) -> None:
    # given two butlers of one tenant, each with its own token
    health = Butler(front.url, new_token(engine, tenant_a, ["health"]))
    finance = Butler(front.url, new_token(engine, tenant_a, ["finance"]))
    # when both store an episode with the same idempotency key
    mine = health.ok(
        "memory_store_episode", content="Took the blood pressure pill at 8", butler="health", idempotency_key="daily-1"
    )
    theirs = finance.ok(
        "memory_store_episode", content="Paid the electricity bill", butler="finance", idempotency_key="daily-1"
    )
    # then each got a fresh write of its own: neither was dropped, neither learned the other's id
    assert mine["id"] != theirs["id"] and mine["replayed"] is False and theirs["replayed"] is False
    assert applied(health, "episode", mine["id"])["content"] == "Took the blood pressure pill at 8"
    assert applied(finance, "episode", theirs["id"])["content"] == "Paid the electricity bill"
    assert health.error("memory_get", type="episode", id=theirs["id"])["error"] == "permission_denied"
    assert count_rows(engine, "episodes", tenant_a) == 2


def test_two_butlers_with_one_key_each_get_their_own_fact(worker, front: Front, engine: Engine, tenant_a: str) -> None:
    # given two butler tokens writing global facts (the key is scoped to each token's shard butler)
    health = Butler(front.url, new_token(engine, tenant_a, ["health"]))
    finance = Butler(front.url, new_token(engine, tenant_a, ["finance"]))
    a = health.ok("memory_store_fact", subject="user", predicate="doctor", content="Dr. Lee", idempotency_key="k-1")
    b = finance.ok("memory_store_fact", subject="user", predicate="bank", content="Acme Bank", idempotency_key="k-1")
    # then both facts exist
    assert a["id"] != b["id"]
    assert applied(health, "fact", a["id"])["content"] == "Dr. Lee"
    assert applied(finance, "fact", b["id"])["content"] == "Acme Bank"


def test_true_replay_returns_the_same_id(worker, health: Butler, engine: Engine, tenant_a: str) -> None:
    args = {"subject": "user", "predicate": "drink", "content": "The user drinks green tea", "idempotency_key": "f-1"}
    first = health.ok("memory_store_fact", **args)
    again = health.ok("memory_store_fact", **args)
    assert again["id"] == first["id"] and again["replayed"] is True
    applied(health, "fact", first["id"])
    assert count_rows(engine, "facts", tenant_a) == 1
    ((butler, key, digest),) = _intents(engine, tenant_a)
    assert (butler, key) == ("health", "f-1") and len(digest) == 64


def test_same_key_with_another_payload_is_refused_and_writes_nothing(
    worker, health: Butler, engine: Engine, tenant_a: str
) -> None:
    # given an accepted episode
    first = health.ok(
        "memory_store_episode", content="Booked the dentist for Monday", butler="health", idempotency_key="ep-1"
    )
    # when the same key comes back with other content
    err = health.error(
        "memory_store_episode", content="Booked the dentist for Tuesday", butler="health", idempotency_key="ep-1"
    )
    # then it is refused, classified and naming the field, and nothing new is recorded
    assert err["error"] == "idempotency_conflict" and err["field"] == "idempotency_key"
    assert err["retryable"] is False and first["id"] in err["message"]
    assert count_rows(engine, "write_intents", tenant_a) == 1
    assert applied(health, "episode", first["id"])["content"] == "Booked the dentist for Monday"
    assert count_rows(engine, "episodes", tenant_a) == 1


def test_batch_conflicts_are_refused_whole(worker, health: Butler, engine: Engine, tenant_a: str) -> None:
    # one key twice in one batch with two payloads: the whole batch is refused, nothing is recorded
    err = health.error(
        "memory_ingest_batch",
        episodes=[
            {"content": "first", "butler": "health", "idempotency_key": "b-1"},
            {"content": "fresh", "butler": "health"},
            {"content": "second", "butler": "health", "idempotency_key": "b-1"},
        ],
    )
    assert err["error"] == "idempotency_conflict" and err["field"] == "episodes.2.idempotency_key"
    assert count_rows(engine, "write_intents", tenant_a) == 0
    # the same item twice is one write (a replay inside the call)
    out = health.ok(
        "memory_ingest_batch",
        episodes=[
            {"content": "first", "butler": "health", "idempotency_key": "b-1"},
            {"content": "first", "butler": "health", "idempotency_key": "b-1"},
        ],
    )
    assert out["items"][0]["id"] == out["items"][1]["id"] and out["items"][1]["replayed"] is True
    assert count_rows(engine, "write_intents", tenant_a) == 1
    # a one-item batch names the item too
    err = health.error(
        "memory_ingest_batch", episodes=[{"content": "other", "butler": "health", "idempotency_key": "b-1"}]
    )
    assert err["error"] == "idempotency_conflict" and err["field"] == "episodes.0.idempotency_key"


def test_one_key_sent_by_many_callers_at_once_is_one_write(health: Butler, engine: Engine, tenant_a: str) -> None:
    # given twelve retries of one keyed episode arriving together (each accept's first try assumes a fresh key)
    args = {"content": "Moved the dentist to Tuesday", "butler": "health", "idempotency_key": "race-1"}
    with ThreadPoolExecutor(max_workers=12) as pool:
        answers = list(pool.map(lambda _: health.ok("memory_store_episode", **args), range(12)))
    # then every caller gets the one id, all but one as a replay, and one intent is recorded
    assert len({a["id"] for a in answers}) == 1
    assert sorted(a["replayed"] for a in answers) == [False] + [True] * 11
    assert [(butler, key) for butler, key, _ in _intents(engine, tenant_a)] == [("health", "race-1")]
