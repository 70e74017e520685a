"""The fuzzing campaign (issue 16 §E): every tool, through the real MCP client over HTTP, against a real front
process (``memory-butler serve``), PostgreSQL and Redis, with arguments drawn from the tool's own inputSchema and
hostile values (tests/bench/fuzz_values.py), in the world of tests/bench/fuzz_world.py.

Two tenants: A is fuzzed (an admin token and a 'health' butler token take turns); B only lends its memories' ids
and its tenant id. Each answer is one of: a valid result, a classified tool error ({error, message, retryable,
field}; invalid_input must name a field of the call), a JSON-RPC protocol error (a body the transport cannot parse:
a lone surrogate, nesting past the parser's limit), an "internal error", an unclassified error, or a transport
failure. After every call the database's fingerprint (each table's row count and newest row version; for the
memory tables a hash of the rows less the columns a read's reference bump moves) is taken: a refused call must
leave it as it was. A valid result must not carry B's text, nor (for the 'health' token) A's finance-only text.
The front must still answer after each failure (else it counts as a crash and is restarted).
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, Phase, Verbosity, given, seed as hypothesis_seed, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from memory_api.loadtest.client import open_session
from shared.errors import ButlerError
from tests.bench.fuzz_values import Hints, arguments, has_raw, mutate, raw_json
from tests.bench.fuzz_world import CALL_TIMEOUT_S, Fingerprint, FrontProcess, Tenant

KNOWN_CODES = frozenset(
    c.code
    for c in (*ButlerError.__subclasses__(), *(s for c in ButlerError.__subclasses__() for s in c.__subclasses__()))
) - {ButlerError.code}
# JSON-RPC errors the server answers for a body it cannot take (parse error, invalid request, unknown method,
# invalid params): refused at the protocol level, before any tool ran. Others (a timeout, a lost connection) are
# transport failures.
PROTOCOL_ERRORS = frozenset({-32700, -32600, -32601, -32602})
MUST_BE_ZERO = (
    "internal_error",
    "unclassified",
    "unnamed_field",
    "oversized_error",
    "refused_wrote",
    "leaks",
    "crashes",
    "transport_errors",
    "invalid_result",
)
COLUMNS = ("calls", "hostile", "valid", "valid_wrote", "degraded", "classified", *MUST_BE_ZERO)
# A refusal says what broke in a few lines; one that quotes a hostile value whole (a 1 MB string) is a defect.
MAX_ERROR_CHARS = 4_096


@dataclass
class Tally:
    """Counts per tool; ``first`` keeps one example of each kind of failure for the report."""

    per_tool: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    first: dict[str, str] = field(default_factory=dict)
    seconds: Counter[str] = field(default_factory=Counter)

    def add(self, tool: str, *keys: str) -> None:
        for key in keys:
            self.per_tool[tool][key] += 1

    def note(self, kind: str, detail: str) -> None:
        self.first.setdefault(kind, detail[:2000])

    @property
    def total(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for counts in self.per_tool.values():
            out.update(counts)
        return out

    def failures(self) -> dict[str, int]:
        total = self.total
        return {k: total[k] for k in MUST_BE_ZERO if total[k]}

    def table(self) -> str:
        classes = sorted({k for c in self.per_tool.values() for k in c if k.startswith(("error:", "protocol:"))})
        head = ["tool", *COLUMNS]
        rows = [[tool, *(str(c[k]) for k in COLUMNS)] for tool, c in sorted(self.per_tool.items())]
        total = self.total
        rows.append(["ALL", *(str(total[k]) for k in COLUMNS)])
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        lines = [
            "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in [head, *rows]
        ]
        lines.append("classified errors by class: " + ", ".join(f"{k} {total[k]}" for k in classes))
        return "\n".join(lines)


class Campaign:
    """Runs the calls and keeps the tally; see the module docstring for what each answer counts as."""

    def __init__(self, engine: Engine, front: FrontProcess, a: Tenant, b: Tenant) -> None:
        self.engine, self.front, self.a, self.b = engine, front, a, b
        self.tally = Tally()
        self.fingerprint = Fingerprint(engine)
        self.hints = Hints(
            own_ids=[i for ids in a.ids.values() for i in ids],
            other_ids=[i for ids in b.ids.values() for i in ids],
            other_tenant=b.id,
        )
        self.other_ids = set(self.hints.other_ids)
        self.schemas: dict[str, dict[str, Any]] = {}
        self.portal: BlockingPortal | None = None
        self.sessions: dict[str, Any] = {}
        self.n = 0

    @contextmanager
    def running(self) -> Iterator[Campaign]:
        with start_blocking_portal() as portal:
            self.portal = portal
            try:
                self._open_sessions()
                tools = self.portal.call(self.sessions["admin"].list_tools)
                self.schemas = {t.name: t.input_schema for t in tools.tools}
                self.portal.call(self.sessions["butler"].list_tools)  # so the client checks results' schemas
                self.before = self.fingerprint.take()
                yield self
            finally:
                self._close_sessions()
                self.portal = None

    def _open_sessions(self) -> None:
        assert self.portal is not None
        self._stack = ExitStack()
        for who, token in (("admin", self.a.admin), ("butler", self.a.butler)):
            session = open_session(self.front.url, token, timeout_s=CALL_TIMEOUT_S)
            self.sessions[who] = self._stack.enter_context(self.portal.wrap_async_context_manager(session))

    def _close_sessions(self) -> None:
        stack, self._stack = getattr(self, "_stack", None), None
        self.sessions = {}
        if stack is not None:
            try:
                stack.close()
            except Exception:  # noqa: BLE001 - a session the front dropped is already closed
                pass

    def run(self, calls: int, seed: int | None) -> Tally:
        """``calls`` calls drawn by hypothesis (a fixed derandomised sequence, or ``seed``'s)."""
        names = sorted(self.schemas)

        @settings(
            max_examples=calls,
            derandomize=seed is None,
            database=None,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
            verbosity=Verbosity.quiet,
        )
        @given(st.data())
        def one(data: st.DataObject) -> None:
            hostile = data.draw(st.booleans())  # half the calls break something
            tool = data.draw(st.sampled_from(names))
            who = data.draw(st.sampled_from(("admin", "butler")))
            schema = self.schemas[tool]
            args = data.draw(arguments(schema, self.hints))
            self._pair_ids(data, args)
            request_id = f"fuzz-{self.n}"
            if isinstance(args.get("request_context"), dict) or data.draw(st.booleans()):
                args["request_context"] = {"request_id": request_id}
            if hostile:
                args = data.draw(mutate(args, schema, self.hints))
            self.call(tool, who, args, hostile=hostile)

        if seed is not None:
            one = hypothesis_seed(seed)(one)
        one()
        return self.tally

    def _pair_ids(self, data: st.DataObject, args: dict[str, Any]) -> None:
        """Half the time an id field gets an id of the kind the call names, of this tenant or the other one,
        so calls reach the memory instead of stopping at not_found."""
        kind = "rule" if "rule_id" in args else args.get("type")
        key = "rule_id" if "rule_id" in args else "id"
        if key not in args or kind not in ("episode", "fact", "rule") or not data.draw(st.booleans()):
            return
        tenant = data.draw(st.sampled_from((self.a, self.a, self.b)))
        if tenant.ids.get(kind):
            args[key] = data.draw(st.sampled_from(tenant.ids[kind]))

    def call(self, tool: str, who: str, args: dict[str, Any], *, hostile: bool = False) -> None:
        self.n += 1
        self.tally.add(tool, "calls", *(["hostile"] if hostile else []))
        started = time.perf_counter()
        try:
            answer = self._raw(tool, who, args) if has_raw(args) else self._client(tool, who, args)
        except Exception as exc:  # noqa: BLE001 - a transport failure: is the front still there?
            self._transport_failure(tool, args, exc)
            return
        finally:
            self.tally.seconds["calls"] += time.perf_counter() - started
        refused = self._classify(tool, who, args, answer)
        started = time.perf_counter()
        after = self.fingerprint.take()
        self.tally.seconds["fingerprints"] += time.perf_counter() - started
        if after != self.before:  # a valid write shows here too: the check sees writes (the suite asserts it)
            changed = sorted(t for t in after if after[t] != self.before.get(t))
            self.tally.add(tool, "refused_wrote" if refused else "valid_wrote")
            if refused:
                self.tally.note("refused_wrote", f"{tool} {_short(args)} -> {_short(answer)} changed {changed}")
        self.before = after

    def _client(self, tool: str, who: str, args: dict[str, Any]) -> dict[str, Any]:
        from mcp.shared.exceptions import MCPError

        assert self.portal is not None
        session = self.sessions[who]
        try:
            result = self.portal.call(lambda: session.call_tool(tool, args, read_timeout_seconds=CALL_TIMEOUT_S))
        except MCPError as exc:
            if exc.error.code not in PROTOCOL_ERRORS:  # a timeout or a dropped connection: a transport failure
                raise
            return {"protocol": exc.error.code, "message": exc.error.message}
        except RuntimeError as exc:  # the client found the result does not match the tool's outputSchema
            if "structured content" in str(exc).lower() or "output schema" in str(exc).lower():
                return {"invalid_result": str(exc)}
            raise
        return {
            "isError": result.is_error,
            "structuredContent": result.structured_content,
            "text": result.content[0].text if result.content and hasattr(result.content[0], "text") else "",
        }

    def _raw(self, tool: str, who: str, args: dict[str, Any]) -> dict[str, Any]:
        """Values the client cannot encode go as a raw JSON-RPC body over the same HTTP endpoint."""
        token = self.a.admin if who == "admin" else self.a.butler
        body = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":%s,"arguments":%s}}' % (
            json.dumps(tool),
            raw_json(args),
        )
        response = httpx.post(
            self.front.url,
            content=body,
            timeout=CALL_TIMEOUT_S,
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
            },
        )
        if response.status_code >= 500:
            return {"http": response.status_code, "text": response.text}
        message = response.json()
        if "error" in message:
            if message["error"]["code"] not in PROTOCOL_ERRORS:
                raise RuntimeError(f"JSON-RPC error {message['error']}")
            return {"protocol": message["error"]["code"], "message": message["error"].get("message")}
        result = message["result"]
        return {
            "isError": result.get("isError", False),
            "structuredContent": result.get("structuredContent"),
            "text": (result.get("content") or [{}])[0].get("text", ""),
        }

    def _classify(self, tool: str, who: str, args: dict[str, Any], answer: dict[str, Any]) -> bool:
        """Count the answer; True when the call was refused (so it must have written nothing)."""
        add, note = (lambda *k: self.tally.add(tool, *k)), self.tally.note
        if "invalid_result" in answer:
            add("invalid_result")
            note("invalid_result", f"{tool} {_short(args)} -> {answer['invalid_result']}")
            return False
        if "http" in answer:
            add("internal_error")
            note("internal_error", f"{tool} {_short(args)} -> HTTP {answer['http']} {answer['text'][:300]}")
            return True
        body = answer.get("structuredContent") or {}
        if answer.get("isError", True) and len(json.dumps(answer, default=str)) > MAX_ERROR_CHARS:
            add("oversized_error")
            note("oversized_error", f"{tool} {_short(args)} -> {_short(answer)}")
        if "protocol" in answer:
            add("classified", f"protocol:{answer['protocol']}")
            return True
        if not answer["isError"]:
            add("valid", *(["degraded"] if body.get("degraded") else []))
            self._check_leak(tool, who, args, answer)
            return False
        code = body.get("error")
        if code == ButlerError.code or "internal error" in str(body.get("message", "")):
            add("internal_error")
            note("internal_error", f"{tool} {_short(args)} -> {_short(body)} (request_id {body.get('request_id')})")
        elif (
            code not in KNOWN_CODES
            or not isinstance(body.get("message"), str)
            or not isinstance(body.get("retryable"), bool)
        ):
            add("unclassified")
            note("unclassified", f"{tool} {_short(args)} -> {_short(answer)}")
        else:
            add("classified", f"error:{code}")
            if code == "invalid_input" and not self._names_a_field(tool, args, body):
                add("unnamed_field")
                note("unnamed_field", f"{tool} {_short(args)} -> {_short(body)}")
        return True

    def _names_a_field(self, tool: str, args: dict[str, Any], body: dict[str, Any]) -> bool:
        """invalid_input names a field: one the call passed or the tool takes (``episodes.2.content``)."""
        name = body.get("field")
        if not isinstance(name, str) or not name:
            return False
        head = name.split(".", 1)[0]
        return head == "arguments" or head in args or head in self.schemas[tool].get("properties", {})

    def _check_leak(self, tool: str, who: str, args: dict[str, Any], answer: dict[str, Any]) -> None:
        """B's text anywhere, or a B id as an id (not as text A itself stored, e.g. content = a B id from the
        hostile values) that the call did not name; for the 'health' token, A's finance-only text too."""
        body = answer.get("structuredContent")
        shown = json.dumps(body, ensure_ascii=False) + str(answer.get("text", ""))
        if who == "admin" and self.a.marker in shown:  # the admin may read A's finance memories: the check sees text
            self.tally.add(tool, "admin_saw_finance")
        secrets = [self.b.marker, *([self.a.marker] if who == "butler" else [])]
        named = json.dumps(args, default=str)
        leaked = [s for s in secrets if s in shown] + [
            i for i in _id_values(body) if i in self.other_ids and i not in named
        ]
        if leaked:
            self.tally.add(tool, "leaks")
            self.tally.note("leaks", f"{who} {tool} {_short(args)} -> {leaked[:3]}: {shown[:2000]}")

    def _transport_failure(self, tool: str, args: dict[str, Any], exc: BaseException) -> None:
        self.tally.add(tool, "transport_errors")
        self.tally.note("transport_errors", f"{tool} {_short(args)} -> {exc!r}")
        if not self.front.alive():
            self.tally.add(tool, "crashes")
            self.tally.note("crashes", f"{tool} {_short(args)} -> front gone: {exc!r}")
            self.front.stop()
            self.front.start()
        self._close_sessions()
        self._open_sessions()
        self.before = self.fingerprint.take()

    def finish(self) -> None:
        """The front must still be up after the last call."""
        if not self.front.alive():
            self.tally.add("(end)", "crashes")
            self.tally.note("crashes", "the front was not answering after the last call")


# Fields that carry what a caller wrote (which may be any string, another tenant's id included), not references.
CALLER_TEXT = frozenset(
    {
        "content",
        "context",
        "text",
        "reason",
        "subject",
        "predicate",
        "tags",
        "session_id",
        "idempotency_key",
        "request_id",
        "subrequest_id",
        "segment_id",
        "preceding",
        "payload",
        "anti_pattern",
        "last_error",
        "error",
    }
)


def _id_values(node: Any, key: str = "") -> Iterator[str]:
    """Every string in a result outside the fields that carry caller text."""
    if key in CALLER_TEXT:
        return
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _id_values(v, str(k))
    elif isinstance(node, list):
        for v in node:
            yield from _id_values(v, key)


def _short(value: Any, limit: int = 300) -> str:
    text_ = json.dumps(value, default=repr, ensure_ascii=True)
    return text_ if len(text_) <= limit else f"{text_[:limit]}... ({len(text_)} chars)"
