"""The fuzzing campaign's world: a real front process, two seeded tenants, and the database's fingerprint.

``FrontProcess`` runs ``memory-butler serve`` on a free port (its log kept, to count "tool crashed" tracebacks).
``seed_tenants`` makes tenants A and B with episodes, facts and rules in global, 'health' and 'finance' scopes,
written through the front and applied as a worker would. ``Fingerprint`` is one query giving each table's row
count and newest row version (for the memory tables, a hash of the rows less the columns a read's reference bump
moves afterwards): equal before and after a call means the call wrote nothing.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sqlalchemy import Engine, text

from memory_api.loadtest.client import open_session
from shared.config import load_settings
from shared.db import unit_of_work
from shared.tenancy import create_token, ensure_tenant

CALL_TIMEOUT_S = 60.0
# Columns a read moves after the fact (shared.references: reference bumps, an anti-pattern's keep-alive), and
# derived ones too large to hash on every call.
VOLATILE = ("reference_count", "last_referenced_at", "embedding", "search_vector", "context_vector")
MEMORY_TABLES = ("episodes", "facts", "rules")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FrontProcess:
    """``memory-butler serve`` as a subprocess on a free port, its log in ``log_path``."""

    def __init__(self, database_url: str, redis_url: str, log_path: Path) -> None:
        self.database_url, self.redis_url, self.log_path = database_url, redis_url, log_path
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> FrontProcess:
        self.port = free_port()
        env = {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "REDIS_URL": self.redis_url,
            "MEMORY_BUTLER_LOG_LEVEL": "INFO",
        }
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memory_api", "serve", "--host", "127.0.0.1", "--port", str(self.port)],
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the front exited at start ({self.proc.returncode}); see {self.log_path}")
            if self.healthy():
                return self
            time.sleep(0.2)  # waiting for a subprocess to listen: no event to wait on
        raise TimeoutError("the front did not become healthy")

    def healthy(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.healthy()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


@dataclass
class Tenant:
    """A seeded tenant: its tokens, the text only it may see, its memories' ids by kind."""

    id: str
    admin: str
    butler: str  # a 'health' butler token
    marker: str  # text in this tenant's memories that nobody else may see
    ids: dict[str, list[str]] = field(default_factory=dict)


class Fingerprint:
    """One query: for each table, its row count and newest row version (for the memory tables, a hash of the
    rows without the columns a read's reference bump moves). Equal before and after = nothing written."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        with engine.connect() as conn:
            tables = (
                conn.execute(
                    text(
                        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' "
                        "AND table_type = 'BASE TABLE' AND table_name <> 'alembic_version' "
                        # a partition's rows are its parent's (episodes, memory_events): hashed there, volatile
                        # columns left out, once
                        "AND table_name NOT IN (SELECT relname FROM pg_class WHERE relispartition) ORDER BY 1"
                    )
                )
                .scalars()
                .all()
            )
        parts = []
        for t in tables:
            if t in MEMORY_TABLES:
                dropped = "".join(f" - '{c}'" for c in VOLATILE)
                keep_alive = (
                    " - CASE WHEN t.maturity = 'anti_pattern' THEN 'last_confirmed_at' ELSE '' END"
                    if t == "rules"
                    else ""
                )
                row = f"sum(hashtext((to_jsonb(t){dropped}{keep_alive})::text)::bigint)"
            else:
                row = "max(t.xmin::text::bigint)"
            parts.append(f"SELECT '{t}' AS t, count(*) AS n, coalesce({row}, 0) AS h FROM {t} t")
        self.sql = text(" UNION ALL ".join(parts))

    def take(self) -> dict[str, tuple[int, int]]:
        with self.engine.connect() as conn:
            return {r.t: (r.n, r.h) for r in conn.execute(self.sql)}


def seed_tenants(engine: Engine, front_url: str, database_url: str, redis_url: str) -> tuple[Tenant, Tenant]:
    """Tenants A and B, each with episodes, facts and rules in global, 'health' and 'finance' scopes (written
    through the front, applied as a worker would) and one dead-lettered episode."""
    import anyio

    tenants = []
    for label in ("a", "b"):
        tid = f"t-fuzz-{label}-{uuid.uuid4().hex[:8]}"
        with unit_of_work(engine) as conn:
            ensure_tenant(conn, tenant_id=tid)
            _, admin = create_token(conn, tenant_id=tid, name="fuzz-admin", butlers=["*"], role="admin")
            _, butler = create_token(conn, tenant_id=tid, name="fuzz-health", butlers=["health"], role="butler")
        tenants.append(Tenant(tid, admin, butler, marker=f"zq{uuid.uuid4().hex[:12]}"))
    a, b = tenants
    for t in tenants:
        anyio.run(_store_seeds, front_url, t, t is a)
    _apply_all(engine, database_url, redis_url)
    with unit_of_work(engine) as conn:
        for t in tenants:
            conn.execute(
                text(
                    "UPDATE episodes SET consolidation_status = 'dead_letter', last_consolidation_error = 'fuzz seed' "
                    "WHERE id = (SELECT id FROM episodes WHERE tenant_id = :t ORDER BY created_at LIMIT 1)"
                ),
                {"t": t.id},
            )
            for kind, table in (("episode", "episodes"), ("fact", "facts"), ("rule", "rules")):
                t.ids[kind] = [
                    str(i)
                    for i in conn.execute(
                        text(f"SELECT id FROM {table} WHERE tenant_id = :t ORDER BY id"), {"t": t.id}
                    ).scalars()
                ]
    return a, b


async def _store_seeds(front_url: str, tenant: Tenant, is_a: bool) -> None:
    from memory_api.loadtest.client import call_tool

    secret = tenant.marker  # A's finance memories carry A's marker (hidden from 'health'); all of B's carry B's
    async with open_session(front_url, tenant.admin, timeout_s=CALL_TIMEOUT_S) as s:
        for scope in ("global", "health", "finance"):
            mark = secret if (not is_a or scope == "finance") else "plain"
            butler = "general" if scope == "global" else scope
            for topic in ("penicillin allergy", "dentist on Tuesday", "monthly budget"):
                await call_tool(
                    s,
                    "memory_store_episode",
                    {"content": f"{topic} noted ({mark})", "butler": butler},
                    timeout_s=CALL_TIMEOUT_S,
                )
            await call_tool(
                s,
                "memory_store_fact",
                {
                    "subject": "user",
                    "predicate": f"likes_{scope}",
                    "content": f"The user likes coffee ({mark})",
                    "scope": scope,
                },
                timeout_s=CALL_TIMEOUT_S,
            )
            await call_tool(
                s,
                "memory_store_rule",
                {"content": f"Always confirm before paying ({mark})", "scope": scope},
                timeout_s=CALL_TIMEOUT_S,
            )


def _apply_all(engine: Engine, database_url: str, redis_url: str) -> None:
    from memory_workers.extractors import build_extractor
    from memory_workers.tasks import Runtime
    from memory_workers.tasks.ingest import apply_pending
    from shared.embedding import get_embedder
    from shared.writes import Actor

    cfg = load_settings(database_url=database_url, redis_url=redis_url)
    rt = Runtime(cfg, engine, get_embedder(), build_extractor(cfg.consolidation))
    with engine.connect() as conn:
        keys = conn.execute(text("SELECT DISTINCT tenant_id, butler FROM write_intents WHERE status = 'pending'")).all()
    for tenant_id, butler in keys:
        apply_pending(rt, tenant_id=tenant_id, butler=butler, actor=Actor("worker:fuzz-seed"))


def log_crashes(log_path: Path) -> int:
    """Tracebacks the front logged for a tool ("tool crashed"): the server's side of an internal error."""
    if not log_path.exists():
        return 0
    return sum(1 for line in log_path.read_text(errors="replace").splitlines() if "tool crashed" in line)
