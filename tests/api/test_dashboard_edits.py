"""Corrections from the dashboard go through the same domain services as the tools: an edited fact is superseded
by a new one (fact.stored + fact.superseded), deletes are reversible retractions, rule lifecycle actions follow the
maturity table, and every refused transition is a classified 409 that writes nothing."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from shared.config import Settings
from tests.api.conftest import Front, new_tenant, new_token
from tests.api.dashboard_client import Dash, count_events, events_about
from tests.dashboard_seed import Seeded, seed


@pytest.fixture()
def seeded(engine: Engine, api_settings: Settings) -> Seeded:
    return seed(engine, new_tenant(engine), api_settings)


@pytest.fixture()
def admin(front: Front, engine: Engine, seeded: Seeded) -> Dash:
    return Dash(front.base, new_token(engine, seeded.tenant, ["*"], role="admin"))


def _refused(response: object, code: str, status: int = 409) -> dict:
    assert response.status_code == status, response.text  # type: ignore[attr-defined]
    body = response.json()  # type: ignore[attr-defined]
    assert body["error"] == code, body
    return body


def test_editing_a_fact_supersedes_it_through_store_fact(admin: Dash, engine: Engine, seeded: Seeded) -> None:
    old = seeded.facts["color"]
    out = admin.ok(
        "PUT",
        f"/api/memory/facts/{old}",
        json={"content": "The user's favorite color is teal"},
        headers={"X-Request-Id": "edit-1"},
    )
    assert out["supersedes"] == str(old)
    detail = admin.get(f"/api/memory/facts/{out['id']}")
    assert detail["fact"]["content"] == "The user's favorite color is teal"
    assert detail["fact"]["validity"] == "active" and detail["fact"]["source_butler"] == "dashboard"
    chain = detail["supersession_chain"]
    assert [f["id"] for f in chain] == [str(seeded.facts["color_old"]), str(old), out["id"]]
    assert chain[1]["validity"] == "superseded" and chain[1]["superseded_by_id"] == out["id"]
    stored = events_about(engine, seeded.tenant, out["id"])
    assert [(e["event_type"], e["actor"], e["request_id"]) for e in stored] == [("fact.stored", "dashboard", "edit-1")]
    assert events_about(engine, seeded.tenant, old)[-1]["event_type"] == "fact.superseded"
    found = admin.get("/api/memory/search", q="favorite color teal", types="fact")["results"]
    assert found[0]["id"] == out["id"]  # the new fact was embedded: the hybrid search finds it by meaning


def test_a_superseded_fact_cannot_be_edited(admin: Dash, engine: Engine, seeded: Seeded) -> None:
    before = count_events(engine, seeded.tenant)
    body = _refused(
        admin.call("PUT", f"/api/memory/facts/{seeded.facts['color_old']}", json={"content": "x"}), "invalid_transition"
    )
    assert "superseded" in body["message"] and count_events(engine, seeded.tenant) == before


def test_delete_is_a_reversible_retraction(admin: Dash, engine: Engine, seeded: Seeded) -> None:
    fact = seeded.facts["dentist"]
    admin.ok("DELETE", f"/api/memory/facts/{fact}")
    assert admin.get(f"/api/memory/facts/{fact}")["fact"]["validity"] == "retracted"
    admin.ok("DELETE", f"/api/memory/facts/{fact}")  # idempotent: no second event
    _refused(admin.call("PUT", f"/api/memory/facts/{fact}", json={"content": "x"}), "invalid_transition")
    admin.ok("POST", f"/api/memory/facts/{fact}/restore")
    assert admin.get(f"/api/memory/facts/{fact}")["fact"]["validity"] == "active"
    assert [e["event_type"] for e in events_about(engine, seeded.tenant, fact)][-2:] == [
        "fact.forgotten",
        "fact.restored",
    ]
    admin.ok("POST", f"/api/memory/facts/{fact}/confirm")


def test_editing_a_rule_starts_it_over_as_a_candidate(admin: Dash, engine: Engine, seeded: Seeded) -> None:
    rule = seeded.rules["proven"]
    admin.ok("PUT", f"/api/memory/rules/{rule}", json={"content": "Confirm every medication change in writing"})
    detail = admin.get(f"/api/memory/rules/{rule}")
    assert detail["rule"]["maturity"] == "candidate" and detail["rule"]["success_count"] == 0
    assert len(detail["applications"]) == 16  # the history stays
    types = [e["event_type"] for e in events_about(engine, seeded.tenant, rule)][-2:]
    assert types == ["rule.edited", "rule.maturity_changed"]
    _refused(
        admin.call("PUT", f"/api/memory/rules/{seeded.rules['anti']}", json={"content": "x"}), "invalid_transition"
    )


def test_promote_and_demote_follow_the_maturity_table(admin: Dash, engine: Engine, seeded: Seeded) -> None:
    candidate = seeded.rules["candidate"]
    assert admin.ok("POST", f"/api/memory/rules/{candidate}/promote")["maturity"] == "established"
    assert admin.ok("POST", f"/api/memory/rules/{candidate}/promote")["maturity"] == "proven"
    before = count_events(engine, seeded.tenant)
    _refused(admin.call("POST", f"/api/memory/rules/{candidate}/promote"), "invalid_transition")
    _refused(admin.call("POST", f"/api/memory/rules/{seeded.rules['anti']}/promote"), "invalid_transition")
    _refused(admin.call("POST", f"/api/memory/rules/{seeded.rules['finance']}/demote"), "invalid_transition")
    assert count_events(engine, seeded.tenant) == before
    assert admin.ok("POST", f"/api/memory/rules/{candidate}/demote")["maturity"] == "established"
    last = events_about(engine, seeded.tenant, candidate)[-1]
    assert last["event_type"] == "rule.maturity_changed" and last["payload"]["manual"] is True


def test_disable_and_restore_a_rule(admin: Dash, seeded: Seeded) -> None:
    rule = seeded.rules["established"]
    admin.ok("POST", f"/api/memory/rules/{rule}/disable")
    assert admin.get(f"/api/memory/rules/{rule}")["rule"]["validity"] == "retracted"
    _refused(admin.call("POST", f"/api/memory/rules/{rule}/promote"), "invalid_transition")
    admin.ok("POST", f"/api/memory/rules/{rule}/restore")
    admin.ok("DELETE", f"/api/memory/rules/{rule}")
    assert admin.get("/api/memory/rules", validity="retracted")["items"][0]["id"] == str(rule)
    # the legacy word is accepted as input and means the same (seed 001)
    assert admin.get("/api/memory/rules", validity="forgotten")["items"][0]["id"] == str(rule)


def test_bad_bodies_are_refused_and_write_nothing(admin: Dash, engine: Engine, seeded: Seeded) -> None:
    fact, before = seeded.facts["color"], count_events(engine, seeded.tenant)
    url = f"/api/memory/facts/{fact}"
    assert _refused(admin.call("PUT", url, json={}), "invalid_input", 400)
    assert _refused(admin.call("PUT", url, json={"subject": "x"}), "invalid_input", 400)["field"] == "subject"
    assert (
        _refused(admin.call("PUT", url, json={"permanence": "forever"}), "invalid_input", 400)["field"] == "permanence"
    )
    assert _refused(admin.call("PUT", url, json={"content": "x" * 20_001}), "invalid_input", 400)["field"] == "content"
    big = b'{"content": "' + b"x" * 70_000 + b'"}'
    assert (
        _refused(
            admin.call("PUT", url, content=big, headers={"Content-Type": "application/json"}), "payload_too_large", 413
        )["field"]
        == "body"
    )
    _refused(
        admin.call("PUT", url, content=b"{not json", headers={"Content-Type": "application/json"}), "invalid_input", 400
    )
    assert count_events(engine, seeded.tenant) == before
