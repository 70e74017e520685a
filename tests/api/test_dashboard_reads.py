"""The dashboard's read endpoints against the real front and database: filters in SQL, deterministic order,
pagination with a hard cap, provenance and supersession chains, the activity cursor, health charts, search."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from shared.config import Settings
from tests.api.conftest import Front, new_tenant, new_token
from tests.api.dashboard_client import Dash
from tests.dashboard_seed import Seeded, seed


@pytest.fixture(scope="module")
def seeded(engine: Engine, api_settings: Settings) -> Seeded:
    return seed(engine, new_tenant(engine), api_settings)


@pytest.fixture(scope="module")
def admin(front: Front, engine: Engine, seeded: Seeded) -> Dash:
    return Dash(front.base, new_token(engine, seeded.tenant, ["*"], role="admin"))


def _ids(items: list[dict]) -> list[str]:
    return [item["id"] for item in items]


def test_facts_are_grouped_by_subject_and_page_deterministically(admin: Dash, seeded: Seeded) -> None:
    # given every fact of the tenant, when paged two at a time, then the pages add up to the one full list
    full = admin.get("/api/memory/facts")["items"]
    assert [(f["subject"], f["predicate"]) for f in full] == sorted((f["subject"], f["predicate"]) for f in full)
    pages, offset = [], 0
    while offset is not None:
        page = admin.get("/api/memory/facts", limit=2, offset=offset)
        pages += page["items"]
        offset = page["next_offset"]
    assert _ids(pages) == _ids(full) and len(full) == len(seeded.facts)
    old = next(f for f in full if f["id"] == str(seeded.facts["color_old"]))
    assert old["validity"] == "superseded" and old["superseded_by_id"] == str(seeded.facts["color"])


def test_fact_filters_are_applied(admin: Dash, seeded: Seeded) -> None:
    def ids(**params: object) -> set[str]:
        return set(_ids(admin.get("/api/memory/facts", **params)["items"]))

    assert ids(subject="dentist") == {str(seeded.facts["dentist"])}
    assert ids(q="peanuts") == {str(seeded.facts["allergy"])}
    assert ids(permanence="permanent") == {str(seeded.facts["allergy"])}
    assert ids(source_butler="finance") == {str(seeded.facts["budget"])}
    assert ids(validity="superseded") == {str(seeded.facts["color_old"])}
    assert str(seeded.facts["budget"]) not in ids(scope="health")
    assert ids(min_confidence=0.99, subject="user", validity="active") == {
        str(seeded.facts[n]) for n in ("color", "allergy", "budget")
    }


def test_fact_detail_has_provenance_and_the_whole_chain(admin: Dash, seeded: Seeded) -> None:
    detail = admin.get(f"/api/memory/facts/{seeded.facts['color_old']}")
    assert _ids(detail["supersession_chain"]) == [str(seeded.facts["color_old"]), str(seeded.facts["color"])]
    assert [link["relation"] for link in detail["links_in"]] == ["supersedes"]
    assert "fact.superseded" in [e["event_type"] for e in detail["events"]]
    allergy = admin.get(f"/api/memory/facts/{seeded.facts['allergy']}")
    assert _ids(allergy["source_episodes"]) == [str(seeded.episodes["allergy"])]
    assert allergy["fact"]["source_butler"] == "health"


def test_rules_come_in_playbook_order_with_filters(admin: Dash, seeded: Seeded) -> None:
    rules = admin.get("/api/memory/rules")["items"]
    assert [r["maturity"] for r in rules] == ["proven", "established", "candidate", "candidate", "anti_pattern"]
    assert _ids(admin.get("/api/memory/rules", maturity="proven")["items"]) == [str(seeded.rules["proven"])]
    assert _ids(admin.get("/api/memory/rules", q="reminders")["items"]) == [str(seeded.rules["established"])]
    detail = admin.get(f"/api/memory/rules/{seeded.rules['anti']}")
    assert [a["outcome"] for a in detail["applications"]] == ["harmful"] * 3
    assert detail["rule"]["content"].startswith("ANTI-PATTERN:")


def test_episodes_filter_by_butler_status_and_time(admin: Dash, seeded: Seeded) -> None:
    items = admin.get("/api/memory/episodes")["items"]
    assert _ids(items) == [str(seeded.episodes[n]) for n in ("allergy", "budget", "dentist")]  # newest first
    assert _ids(admin.get("/api/memory/episodes", butler="finance")["items"]) == [str(seeded.episodes["budget"])]
    assert admin.get("/api/memory/episodes", status="consolidated")["items"] == []
    newest = items[0]["created_at"]
    assert _ids(admin.get("/api/memory/episodes", to=newest)["items"]) == _ids(items[1:])
    assert _ids(admin.get("/api/memory/episodes", **{"from": newest})["items"]) == _ids(items[:1])
    detail = admin.get(f"/api/memory/episodes/{seeded.episodes['allergy']}")
    assert _ids(detail["facts"]) == [str(seeded.facts["allergy"])]


def test_activity_is_newest_first_with_a_cursor(admin: Dash) -> None:
    first = admin.get("/api/memory/activity", limit=5)
    ids = [e["id"] for e in first["events"]]
    assert ids == sorted(ids, reverse=True) and first["next_cursor"] == ids[-1]
    second = admin.get("/api/memory/activity", limit=5, before=first["next_cursor"])
    assert max(e["id"] for e in second["events"]) < min(ids)
    kinds = {e["entity_type"] for e in admin.get("/api/memory/activity", types="rule", limit=200)["events"]}
    assert kinds == {"rule"}


def test_health_charts_add_up(admin: Dash, seeded: Seeded) -> None:
    health = admin.get("/api/memory/health")["health"]
    active = health["facts"]["by_validity"]["active"]
    assert sum(health["facts"]["active_confidence_bands"].values()) == active == 4
    rated = sum(b["count"] for b in health["charts"]["effectiveness_histogram"])
    assert rated == health["rules"]["effectiveness"]["rated"] == 3
    assert health["episodes"]["backlog"]["count"] == 3
    stats = admin.get("/api/memory/stats")["stats"]
    assert stats["rules"]["by_maturity"]["anti_pattern"] == 1


def test_knowledge_browser_searches_every_type(admin: Dash, seeded: Seeded) -> None:
    found = admin.get("/api/memory/search", q="peanut allergy")["results"]
    assert {h["type"] for h in found} >= {"fact", "episode"}
    assert str(seeded.facts["allergy"]) in _ids(found)
    permanent = admin.get("/api/memory/search", q="peanut allergy", permanence="permanent")["results"]
    assert _ids(permanent) == [str(seeded.facts["allergy"])]


def test_butler_views_are_scoped_to_global_and_the_butler(front: Front, engine: Engine, seeded: Seeded) -> None:
    health = Dash(front.base, new_token(engine, seeded.tenant, ["health"]))
    facts = health.get("/api/butlers/health/memory/facts")["items"]
    assert {f["scope"] for f in facts} == {"global", "health"}
    rules = health.get("/api/butlers/health/memory/rules")["items"]
    assert str(seeded.rules["finance"]) not in _ids(rules)
    episodes = health.get("/api/butlers/health/memory/episodes")["items"]
    assert {e["butler"] for e in episodes} == {"health"}
    stats = health.get("/api/butlers/health/memory/stats")["stats"]
    assert stats["episodes"]["total"] == 2 and stats["scope"] == "health"
    assert health.get("/api/me") == {
        "tenant_id": seeded.tenant,
        "role": "butler",
        "butlers": ["health"],
        "is_admin": False,
    }
    assert health.get("/api/butlers")["butlers"] == ["health"]


def test_page_size_has_a_hard_cap(admin: Dash) -> None:
    response = admin.call("GET", "/api/memory/facts", limit=201)
    assert response.status_code == 400 and response.json()["field"] == "limit"
