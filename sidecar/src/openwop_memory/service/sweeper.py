"""The periodic sweeper: keeps open runs retained, removes what expired, bounds the WAL.

Each pass is :meth:`MemoryService.sweep <.memory.MemoryService.sweep>`: it touches this
process's open runs (so their snapshots outlive retention while in use), then asks storage
to erase expired entries (whatever idempotency key names them) and purge tombstones, run
records and idempotency keys past retention, in small batches so writers never stall. A
failing pass is logged (and counted by the service); the next one runs on schedule.
"""

from __future__ import annotations

import anyio
import structlog

from .memory import MemoryService

log = structlog.get_logger("openwop_memory.sweeper")


class Sweeper:
    """Sweeps ``service`` every ``interval`` seconds, ``batch`` rows a statement."""

    def __init__(self, service: MemoryService, *, interval: float, batch: int) -> None:
        self.service = service
        self.interval = interval
        self.batch = batch

    async def run(self) -> None:
        """Sweep every ``interval`` seconds until cancelled. Never raises otherwise."""
        while True:
            await anyio.sleep(self.interval)
            await self.sweep_once()

    async def sweep_once(self) -> None:
        """One pass. Never raises but for cancellation.

        Logged as ``sweep`` at info when it removed something or a step failed, at debug
        when there was nothing to do (a line a minute of zeros says nothing), and as
        ``sweep_failed`` (error) when the pass failed as a whole.
        """
        try:
            counts = await self.service.sweep(self.batch)
        except Exception as exc:  # noqa: BLE001 - the sweeper outlives its own failures
            log.error(
                "sweep_failed", error_type=type(exc).__name__, reason=getattr(exc, "code", None)
            )
            return
        removed = (
            counts.expired_entries
            + counts.purged_tombstones
            + counts.expired_runs
            + counts.purged_runs
            + counts.purged_idempotency_keys
        )
        (log.info if removed or counts.errors else log.debug)(
            "sweep",
            expired_entries=counts.expired_entries,
            purged_tombstones=counts.purged_tombstones,
            expired_runs=counts.expired_runs,
            purged_runs=counts.purged_runs,
            purged_idempotency_keys=counts.purged_idempotency_keys,
            failed_steps=counts.errors,
        )
