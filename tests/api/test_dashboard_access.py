"""Every dashboard endpoint, from the route table: a happy path, 401 without a token, 403 for a butler token where
an admin one is needed (or another butler's view), 400 for bad input naming the field, and nothing across tenants."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import Engine

from memory_api.dashboard.routes import API, Api
from shared.config import Settings
from tests.api.conftest import Front, new_tenant, new_token
from tests.api.dashboard_client import Dash, count_events
from tests.dashboard_seed import Seeded, seed

# The id each path template is called with (a fresh seed per test, so writes never interfere).
TARGET = {"/api/memory/facts/": "dentist", "/api/memory/rules/": "candidate", "/api/memory/episodes/": "dentist"}
SEED_DICT = {"facts": "facts", "rules": "rules", "episodes": "episodes"}


def _path(api: Api, seeded: Seeded, *, name: str = "health") -> str:
    path = api.path.replace("{name}", name)
    for prefix, key in TARGET.items():
        if path.startswith(prefix):
            kind = prefix.split("/")[3]
            key = "established" if path.endswith("/demote") else key  # a candidate is the lowest level
            path = path.replace("{id}", str(getattr(seeded, SEED_DICT[kind])[key]))
    return path


def _body(api: Api) -> dict | None:
    return {"content": "Dentist appointments go in the late morning"} if api.method == "PUT" else None


def _label(api: Api) -> str:
    return f"{api.method} {api.path}"


@pytest.fixture()
def seeded(engine: Engine, api_settings: Settings) -> Seeded:
    return seed(engine, new_tenant(engine), api_settings)


@pytest.fixture()
def tokens(front: Front, engine: Engine, seeded: Seeded) -> dict[str, Dash]:
    other = new_tenant(engine)
    return {
        "admin": Dash(front.base, new_token(engine, seeded.tenant, ["*"], role="admin")),
        "health": Dash(front.base, new_token(engine, seeded.tenant, ["health"])),
        "other_admin": Dash(front.base, new_token(engine, other, ["*"], role="admin")),
        "none": Dash(front.base, None),
    }


@pytest.mark.parametrize("api", API, ids=_label)
def test_happy_path(api: Api, tokens: dict[str, Dash], seeded: Seeded) -> None:
    params = {"q": "dentist"} if api.path.endswith("/search") else {}
    if api.path.endswith("/restore"):  # only a deleted memory can be restored
        tokens["admin"].ok("DELETE", _path(api, seeded).removesuffix("/restore"))
    response = tokens["admin"].call(api.method, _path(api, seeded), json=_body(api), **params)
    assert response.status_code == 200, response.text
    assert isinstance(response.json(), dict)


@pytest.mark.parametrize("api", API, ids=_label)
def test_no_token_is_401_with_a_json_error(api: Api, tokens: dict[str, Dash], seeded: Seeded) -> None:
    response = tokens["none"].call(api.method, _path(api, seeded), json=_body(api))
    assert response.status_code == 401 and response.json()["error"] == "unauthorized"
    bad = Dash(tokens["none"].base, "mb_not-a-real-token").call(api.method, _path(api, seeded), json=_body(api))
    assert bad.status_code == 401


@pytest.mark.parametrize("api", [a for a in API if a.access == "admin"], ids=_label)
def test_butler_token_cannot_change_memory(api: Api, tokens: dict[str, Dash], engine: Engine, seeded: Seeded) -> None:
    before = count_events(engine, seeded.tenant)
    response = tokens["health"].call(api.method, _path(api, seeded), json=_body(api))
    assert response.status_code == 403 and response.json()["error"] == "permission_denied"
    assert count_events(engine, seeded.tenant) == before


@pytest.mark.parametrize("api", [a for a in API if "{name}" in a.path], ids=_label)
def test_butler_token_cannot_open_another_butlers_view(api: Api, tokens: dict[str, Dash], seeded: Seeded) -> None:
    response = tokens["health"].call(api.method, _path(api, seeded, name="finance"))
    assert response.status_code == 403 and response.json()["field"] == "name"
    bad = tokens["admin"].call(api.method, _path(api, seeded, name="Not A Name"))
    assert bad.status_code == 400 and bad.json()["field"] == "name"


@pytest.mark.parametrize("api", [a for a in API if "{id}" in a.path], ids=_label)
def test_ids_are_checked_and_never_cross_tenants(
    api: Api, tokens: dict[str, Dash], engine: Engine, seeded: Seeded
) -> None:
    before = count_events(engine, seeded.tenant)
    foreign = tokens["other_admin"].call(api.method, _path(api, seeded), json=_body(api))
    assert foreign.status_code == 404 and foreign.json()["error"] == "not_found"
    bad = tokens["admin"].call(api.method, api.path.replace("{id}", "not-a-uuid"), json=_body(api))
    assert bad.status_code == 400 and bad.json()["field"] == "id"
    unknown = tokens["admin"].call(api.method, api.path.replace("{id}", str(uuid.uuid4())), json=_body(api))
    assert unknown.status_code == 404
    assert count_events(engine, seeded.tenant) == before


@pytest.mark.parametrize("api", [a for a in API if "{id}" not in a.path and a.method == "GET"], ids=_label)
def test_lists_refuse_unknown_filters_and_show_nothing_of_another_tenant(
    api: Api, tokens: dict[str, Dash], seeded: Seeded
) -> None:
    params = {"q": "dentist"} if api.path.endswith("/search") else {}
    response = tokens["admin"].call("GET", _path(api, seeded), colour="blue", **params)
    assert response.status_code == 400 and response.json()["field"] == "colour"
    if "{name}" in api.path or api.path in ("/api/me", "/api/butlers"):
        return
    text = tokens["other_admin"].call("GET", _path(api, seeded), **params).text
    mine = [str(i) for d in (seeded.facts, seeded.rules, seeded.episodes) for i in d.values()]
    assert not any(i in text for i in mine)


def test_butler_token_reads_only_its_scopes(tokens: dict[str, Dash], seeded: Seeded) -> None:
    health = tokens["health"]
    facts = health.get("/api/memory/facts")["items"]
    assert str(seeded.facts["budget"]) not in [f["id"] for f in facts] and facts
    denied = health.call("GET", "/api/memory/facts", scope="finance")
    assert denied.status_code == 403 and denied.json()["field"] == "scope"
    detail = health.call("GET", f"/api/memory/facts/{seeded.facts['budget']}")
    assert detail.status_code == 403
    assert health.call("GET", "/api/memory/episodes", butler="finance").status_code == 403
    assert health.get("/api/memory/stats")["scope"] == "health"
    events = health.get("/api/memory/activity", limit=200)["events"]
    assert str(seeded.facts["budget"]) not in {e["entity_id"] for e in events}


def test_openapi_document_is_served_and_lists_the_seed_endpoints(tokens: dict[str, Dash]) -> None:
    doc = tokens["none"].get("/api/openapi.json")
    seed_endpoints = [
        ("get", "/api/memory/stats"),
        ("get", "/api/memory/facts"),
        ("get", "/api/memory/facts/{id}"),
        ("put", "/api/memory/facts/{id}"),
        ("delete", "/api/memory/facts/{id}"),
        ("get", "/api/memory/rules"),
        ("get", "/api/memory/rules/{id}"),
        ("put", "/api/memory/rules/{id}"),
        ("delete", "/api/memory/rules/{id}"),
        ("get", "/api/memory/episodes"),
        ("get", "/api/memory/episodes/{id}"),
        ("get", "/api/memory/activity"),
        *[("get", f"/api/butlers/{{name}}/memory/{v}") for v in ("stats", "facts", "rules", "episodes")],
    ]
    assert all(method in doc["paths"][path] for method, path in seed_endpoints)
    params = {p["name"] for p in doc["paths"]["/api/memory/facts"]["get"]["parameters"]}
    assert {"scope", "subject", "q", "min_confidence", "permanence", "source_butler", "validity", "limit"} <= params
