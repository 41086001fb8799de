"""``openwop-memory mcp``: the sidecar's memory as Model Context Protocol tools.

A process of its own (the ``[mcp]`` extra), a client of the sidecar's socket through
``openwop_memory_client``: the daemon never imports this package or the ``mcp`` SDK, so its
memory and start-up do not change with the extra installed. docs/mcp.md is the user's page.
"""
