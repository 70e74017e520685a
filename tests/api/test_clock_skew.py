"""Supersession is ordered by the database's clock, never a front's (issue 16, item 13): two fronts whose clocks
differ accept writes of one fact key, and the older write never supersedes the newer one."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine

from memory_api.tools import writing
from shared.config import Settings
from tests.api.conftest import Butler, Front, applied, new_token


def _skewed(offset: timedelta):  # noqa: ANN202
    real = writing.utcnow

    def clock() -> datetime:
        return real() + offset

    return clock


@pytest.mark.parametrize(
    "skew", [timedelta(hours=1), timedelta(hours=-1)], ids=["first-front-fast", "second-front-slow"]
)
def test_an_older_write_from_a_fast_front_does_not_supersede_a_newer_one(
    worker,
    front: Front,
    api_settings: Settings,
    engine: Engine,
    tenant_a: str,
    monkeypatch: pytest.MonkeyPatch,
    skew: timedelta,
) -> None:
    token = new_token(engine, tenant_a, ["home"])
    with Front(api_settings) as second:
        first_front, second_front = Butler(front.url, token), Butler(second.url, token)
        # given: the first front's clock is an hour fast (or the second one's an hour slow) while it accepts
        if skew > timedelta(0):
            monkeypatch.setattr(writing, "utcnow", _skewed(skew))
        berlin = first_front.ok(
            "memory_store_fact", subject="user", predicate="lives_in", content="The user lives in Berlin", scope="home"
        )
        applied(first_front, "fact", berlin["id"])
        monkeypatch.undo()
        if skew < timedelta(0):
            monkeypatch.setattr(writing, "utcnow", _skewed(skew))
        # when: a later write of the same key arrives through the other front
        paris = second_front.ok(
            "memory_store_fact", subject="user", predicate="lives_in", content="The user lives in Paris", scope="home"
        )
        applied(second_front, "fact", paris["id"])
        monkeypatch.undo()

    # then: the later write is the active fact and the earlier one its history, whatever the fronts' clocks said
    newer = first_front.ok("memory_get", type="fact", id=paris["id"])["memory"]
    older = first_front.ok("memory_get", type="fact", id=berlin["id"])["memory"]
    assert newer["validity"] == "active", newer
    assert (older["validity"], older["superseded_by_id"]) == ("superseded", paris["id"])
    assert older["created_at"] < newer["created_at"]  # stamped by the database when each write was accepted


def test_a_dashboard_correction_from_a_slow_front_supersedes_the_fact_it_corrects(
    front: Front, api_settings: Settings, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memory_api.dashboard import api_memory
    from tests.api.conftest import new_tenant
    from tests.api.dashboard_client import Dash
    from tests.dashboard_seed import seed

    # given a fact stored a moment ago, and a front whose clock is an hour behind the database's
    seeded = seed(engine, new_tenant(engine), api_settings)
    admin = Dash(front.base, new_token(engine, seeded.tenant, ["*"], role="admin"))
    monkeypatch.setattr(api_memory, "utcnow", _skewed(timedelta(hours=-1)), raising=False)
    old = seeded.facts["allergy"]  # stored just now
    # when an admin corrects it there
    out = admin.ok("PUT", f"/api/memory/facts/{old}", json={"content": "The user is allergic to peanuts and soy"})
    # then the correction is the live fact (it was dated by the front's clock: older, so refused as not live)
    detail = admin.get(f"/api/memory/facts/{out['id']}")
    assert detail["fact"]["validity"] == "active"
    assert admin.get(f"/api/memory/facts/{old}")["fact"]["superseded_by_id"] == out["id"]
