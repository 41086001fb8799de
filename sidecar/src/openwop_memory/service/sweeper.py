"""The periodic sweeper: keeps open runs retained, removes what expired, bounds the WAL.

Each pass touches this process's open runs (so their snapshots outlive retention while
in use), then asks storage to delete expired entries and purge tombstones, run records
and idempotency keys past retention, in small batches so writers never stall. A failing
pass is logged and counted; the next one runs on schedule.
"""

from __future__ import annotations

import anyio
import structlog

from ..config import Settings
from ..domain import SweepHorizons
from .memory import MemoryService

log = structlog.get_logger("openwop_memory.sweeper")


class Sweeper:
    def __init__(self, service: MemoryService, settings: Settings) -> None:
        self.service = service
        self.interval = settings.sweep_interval
        self.batch = settings.sweep_batch
        self.retention_us = int(settings.replay_retention * 1_000_000)

    async def run(self) -> None:
        """Sweep every ``interval`` seconds until cancelled. Never raises otherwise."""
        while True:
            await anyio.sleep(self.interval)
            await self.sweep_once()

    async def sweep_once(self) -> None:
        stats = self.service.stats
        try:
            storage = self.service.storage
            now = storage.clock_us()
            await storage.touch_runs(run_ids=self.service.runs.run_ids(), now_us=now)
            counts = await storage.sweep(
                horizons=SweepHorizons.at(now, self.retention_us), batch_size=self.batch
            )
        except Exception as exc:  # noqa: BLE001 - the sweeper outlives its own failures
            stats.sweep_failures += 1
            log.error(
                "sweep_failed", error_type=type(exc).__name__, reason=getattr(exc, "code", None)
            )
            return
        stats.sweeps += 1
        stats.entries_swept += counts.expired_entries
        stats.tombstones_purged += counts.purged_tombstones
        if counts.errors:
            stats.sweep_failures += 1
        log.info(
            "sweep",
            expired_entries=counts.expired_entries,
            purged_tombstones=counts.purged_tombstones,
            expired_runs=counts.expired_runs,
            purged_runs=counts.purged_runs,
            purged_idempotency_keys=counts.purged_idempotency_keys,
            failed_steps=counts.errors,
        )
