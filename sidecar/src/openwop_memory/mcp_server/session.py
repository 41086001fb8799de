"""One OpenWOP run per MCP session: begun when the session starts, ended when it closes.

So that every read of a session sees one snapshot (RFC 0004's per-run snapshot), the run is
begun once, at the session's ``notifications/initialized`` (or its first tool call, for a
client that sends none), and ended when the session's connection closes. ``replay`` swaps
it for an earlier run's snapshot (``run.begin`` with ``replay``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import anyio
from openwop_memory_client import AsyncMemoryClient, AsyncMemoryRun


class McpSession:
    """The memory side of one MCP session; ``aclose`` ends its run (idempotent).

    Secret values (``secrets`` and those added later) are kept only to re-begin the run;
    they appear in no repr, result or error.
    """

    def __init__(self, client: AsyncMemoryClient, tenant: str, secrets: Mapping[str, str]) -> None:
        self.client = client
        self.tenant = tenant
        self._secrets = dict(secrets)
        self._run: AsyncMemoryRun | None = None
        self._replay = False
        self._lock = anyio.Lock()
        self._closed = False

    def __repr__(self) -> str:
        run_id = self._run.run_id if self._run is not None else None
        return (
            f"McpSession(tenant={self.tenant!r}, run_id={run_id!r}, secrets={len(self._secrets)})"
        )

    async def run(self) -> AsyncMemoryRun:
        """The session's open run, begun on first use.

        :raises ForbiddenError: the sidecar's tenant binding refuses this process the tenant.
        :raises SidecarUnavailableError: no sidecar answered.
        """
        async with self._lock:
            if self._run is None:
                if self._closed:
                    raise RuntimeError("the MCP session has closed")
                await self._begin(f"mcp-{uuid.uuid4()}", replay=False)
            assert self._run is not None
            return self._run

    async def _begin(self, run_id: str, *, replay: bool) -> None:
        run = self.client.run(run_id, self.tenant, self._secrets or None, replay=replay)
        await run.__aenter__()
        self._run, self._replay = run, replay

    async def info(self) -> dict[str, Any]:
        run = await self.run()
        return {
            "runId": run.run_id,
            "tenant": self.tenant,
            "snapshotAt": run.snapshot_at,
            "replay": self._replay,
        }

    async def replay(self, run_id: str) -> None:
        """Read ``run_id``'s snapshot from now on (this session's own run is ended).

        :raises RunNotFoundError: no run of this tenant has that id.
        :raises ReplaySnapshotUnavailableError: its snapshot is gone.
        """
        async with self._lock:
            old, self._run = self._run, None
            if old is not None:
                await old.__aexit__(None, None, None)
            await self._begin(run_id, replay=True)

    async def add_secrets(self, secrets: Mapping[str, str]) -> int:
        run = await self.run()
        count = await run.add_secrets(dict(secrets))
        self._secrets.update(secrets)
        return count

    async def aclose(self) -> None:
        async with self._lock:
            self._closed = True
            run, self._run = self._run, None
        if run is not None:
            with anyio.CancelScope(shield=True):
                await run.__aexit__(None, None, None)
