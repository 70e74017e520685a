"""The dashboard's route table: one line per endpoint (method, path, handler, who may call it, what it does).
The Starlette routes and the OpenAPI document are both made from it (parameters and bodies from the models each
handler's :func:`memory_api.dashboard.http.endpoint` declares), so they cannot disagree."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from memory_api.dashboard import api_fleet as fleet
from memory_api.dashboard import api_memory as mem

Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True)
class Api:
    method: str
    path: str
    handler: Handler
    summary: str
    access: str = "read"  # "read": any token of the tenant; "admin": an admin token (the handler checks both)


FACT, RULE, EPISODE = "/api/memory/facts/{id}", "/api/memory/rules/{id}", "/api/memory/episodes/{id}"
BUTLER = "/api/butlers/{name}/memory"

API: tuple[Api, ...] = (
    Api("GET", "/api/memory/stats", fleet.stats, "System-wide (or one scope's) memory health and counts"),
    Api("GET", "/api/memory/health", fleet.health, "Stats plus the rule-effectiveness histogram (the health charts)"),
    Api("GET", "/api/memory/facts", mem.list_facts, "Browse and filter facts (grouped by subject)"),
    Api("GET", FACT, mem.get_fact, "A fact with provenance, links and its full supersession chain"),
    Api("PUT", FACT, mem.edit_fact, "Correct a fact: a new fact supersedes it (audited)", "admin"),
    Api("DELETE", FACT, mem.delete_fact, "Soft-delete a fact (retracted; reversible)", "admin"),
    Api("POST", FACT + "/restore", mem.restore_fact, "Undo a delete", "admin"),
    Api("POST", FACT + "/confirm", mem.confirm_fact, "Re-confirm a fact (resets its decay)", "admin"),
    Api("GET", "/api/memory/rules", mem.list_rules, "Browse and filter rules (playbook order)"),
    Api("GET", RULE, mem.get_rule, "A rule with its application history and provenance"),
    Api("PUT", RULE, mem.edit_rule, "Rewrite a rule (maturity back to candidate)", "admin"),
    Api("DELETE", RULE, mem.delete_rule, "Soft-delete a rule (retracted; reversible)", "admin"),
    Api("POST", RULE + "/promote", mem.promote_rule, "One maturity step up", "admin"),
    Api("POST", RULE + "/demote", mem.demote_rule, "One maturity step down", "admin"),
    Api("POST", RULE + "/disable", mem.disable_rule, "Take a rule out of use (retracted; restore enables)", "admin"),
    Api("POST", RULE + "/restore", mem.restore_rule, "Undo a delete or disable", "admin"),
    Api("GET", "/api/memory/episodes", mem.list_episodes, "Browse episodes, newest first"),
    Api("GET", EPISODE, mem.get_episode, "An episode with the facts and rules consolidated from it"),
    Api("GET", "/api/memory/activity", fleet.activity, "The memory_events feed, newest first (cursor)"),
    Api("GET", "/api/memory/search", fleet.search, "Knowledge browser: hybrid search over every type"),
    Api("GET", "/api/me", fleet.me, "The token's tenant, role and butlers"),
    Api("GET", "/api/butlers", fleet.butlers, "Butlers this token may open"),
    Api("GET", BUTLER + "/stats", fleet.butler_stats, "Butler-scoped stats (global + name; its episodes)"),
    Api("GET", BUTLER + "/facts", fleet.butler_facts, "Butler-scoped facts (scope in global, name)"),
    Api("GET", BUTLER + "/rules", fleet.butler_rules, "Butler-scoped rules (scope in global, name)"),
    Api("GET", BUTLER + "/episodes", fleet.butler_episodes, "The butler's episodes"),
)
