"""The load-test tool (`memory-butler loadtest`): butler-like MCP clients, metrics, verification, fault drills."""
