"""The MCP SDK's own cost per call: one no-op tool served as the front serves its tools (stateless streamable
HTTP, JSON responses, uvicorn with the same event loop and HTTP parser, the SDK trimmed as the front trims it:
``memory_api.server.lean_sdk``), with /healthz for start-up.

    python -m tests.bench.noop_front PORT

bench_mcp.py measures its CPU per call beside the front's: what no tool of ours can go below on this machine.
"""

from __future__ import annotations

import sys

import uvicorn
from mcp.server.mcpserver import MCPServer
from starlette.requests import Request
from starlette.responses import PlainTextResponse

from memory_api.server import lean_sdk


def main() -> None:
    server = MCPServer("noop")
    lean_sdk(server)

    @server.tool()
    async def noop(text: str) -> dict[str, str]:
        """Answers its argument."""
        return {"text": text}

    @server.custom_route("/healthz", methods=["GET"])
    async def healthz(_: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = server.streamable_http_app(streamable_http_path="/mcp", stateless_http=True, json_response=True)
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_config=None, access_log=False)


if __name__ == "__main__":
    main()
