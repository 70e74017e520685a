"""`memory-butler serve --stdio`: the same tools over stdin/stdout, acting as the configured tenant's admin."""

from __future__ import annotations

import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from shared.config import Settings

ROOT = Path(__file__).resolve().parents[2]


async def _session(params: StdioServerParameters, steps: Any) -> Any:
    with tempfile.TemporaryFile("w+") as errlog:  # the server's JSON logs; shown only if the test fails
        try:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                return await steps(session)
        except BaseException:
            errlog.seek(0)
            sys.stderr.write(errlog.read()[-5000:])
            raise


def test_stdio_serves_the_tools(worker, api_settings: Settings) -> None:
    tenant = f"stdio-{uuid.uuid4().hex[:8]}"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "memory_api", "serve", "--stdio"],
        cwd=str(ROOT),
        env={
            "DATABASE_URL": api_settings.database_url,
            "REDIS_URL": api_settings.redis_url,
            "MEMORY_BUTLER_TENANT_ID": tenant,
            "MEMORY_BUTLER_DATA_DIR": tempfile.mkdtemp(),
        },
    )

    async def steps(session: ClientSession) -> dict[str, Any]:
        names = {t.name for t in (await session.list_tools()).tools}
        stored = await session.call_tool(
            "memory_store_fact", {"subject": "user", "predicate": "editor", "content": "The user edits with vim"}
        )

        async def fetch() -> dict[str, Any]:
            got = await session.call_tool("memory_get", {"type": "fact", "id": stored.structured_content["id"]})
            return got.structured_content

        got = await fetch()
        deadline = anyio.current_time() + 30
        while got["status"] != "ok" and anyio.current_time() < deadline:
            await anyio.sleep(0.1)  # polling the server under test with a deadline
            got = await fetch()
        stats = await session.call_tool("memory_stats", {"scope": "*"})
        return {"names": names, "stored": stored.structured_content, "got": got, "stats": stats.structured_content}

    out = anyio.run(_session, params, steps)
    assert {"memory_context", "memory_store_fact", "memory_dead_letters"} <= out["names"]
    assert out["stored"]["status"] == "accepted" and out["stored"]["butler"] == "memory"
    assert out["got"]["status"] == "ok" and out["got"]["memory"]["content"] == "The user edits with vim"
    assert out["stats"]["stats"]["tenant_id"] == tenant
