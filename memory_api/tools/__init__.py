"""The MCP tools, names and core parameters exactly as the seeds define them (existing butlers work unchanged),
plus the additive ones. Each tool is a short paragraph in its group's module; this module lists them with the
hints a client shows (read-only, idempotent, destructive)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver.tools import Tool
from mcp_types import ToolAnnotations

from memory_api.tools import context, erasure, feedback, ops, reading, writing
from memory_api.tools.results import lean_schema
from memory_api.tools.runtime import ClassifiedTool

READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)


def _write(*, idempotent: bool, destructive: bool) -> ToolAnnotations:
    return ToolAnnotations(
        read_only_hint=False, idempotent_hint=idempotent, destructive_hint=destructive, open_world_hint=False
    )


# A store with an idempotency_key is safe to repeat, without one it is not: the hint says "not idempotent".
# Superseding keeps the old fact (validity "superseded"), so storing a fact is not destructive.
TOOLS: tuple[tuple[Callable[..., Any], str, ToolAnnotations], ...] = (
    (writing.memory_store_episode, "Store an episode", _write(idempotent=False, destructive=False)),
    (writing.memory_store_fact, "Store a fact", _write(idempotent=False, destructive=False)),
    (writing.memory_store_rule, "Store a rule", _write(idempotent=False, destructive=False)),
    (writing.memory_ingest_batch, "Store many episodes", _write(idempotent=False, destructive=False)),
    (reading.memory_search, "Search memory", READ),
    (reading.memory_recall, "Recall what matters about a topic", READ),
    (reading.memory_get, "Get one memory", READ),
    (context.memory_context, "Memory block for a session", READ),
    (context.memory_context_batch, "Memory blocks for many sessions", READ),
    (feedback.memory_confirm, "Confirm a fact or rule", _write(idempotent=True, destructive=False)),
    (feedback.memory_mark_helpful, "Rule helped", _write(idempotent=False, destructive=False)),
    # Repeated harm inverts a rule into an anti-pattern (its text is rewritten; the original is kept).
    (feedback.memory_mark_harmful, "Rule caused harm", _write(idempotent=False, destructive=True)),
    (feedback.memory_forget, "Forget a memory", _write(idempotent=True, destructive=True)),
    (feedback.memory_restore, "Restore a forgotten memory", _write(idempotent=True, destructive=False)),
    (ops.memory_stats, "Memory health", READ),
    (ops.memory_activity_stream, "Audit trail", READ),
    (ops.memory_dead_letters, "Dead letters (admin)", _write(idempotent=False, destructive=True)),
    (erasure.memory_purge_tenant, "Erase this tenant (admin)", _write(idempotent=False, destructive=True)),
)


def build_tools() -> list[Tool]:
    """One Tool per entry; descriptions are the functions' docstrings (written for the agent); each outputSchema
    in its lean form (results.lean_schema: the same values, cheaper for a client to check)."""
    tools = [
        ClassifiedTool.from_function(
            fn,
            name=fn.__name__,
            title=title,
            description=_describe(fn),
            annotations=annotations.model_copy(update={"title": title}),
        )
        for fn, title, annotations in TOOLS
    ]
    for tool in tools:
        if tool.fn_metadata.output_schema is not None:
            tool.fn_metadata.output_schema = lean_schema(tool.fn_metadata.output_schema)
    return tools


def _describe(fn: Callable[..., Any]) -> str:
    return " ".join((fn.__doc__ or "").split())
