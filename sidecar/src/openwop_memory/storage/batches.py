"""The loops a backend's maintenance runs in, written once above the backends: the sweep's
steps in their order, and work done a batch a transaction until a batch comes up short.
A backend gives the batches (its SQL); when they run, in what order, and what a failure
or another sweeper means is decided here."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import anyio
from openwop_memory_client import MemoryServiceError

from .base import SweepCounts

SWEEP_STEPS: tuple[str, ...] = (
    "expired_entries",
    "purged_changes",
    "purged_idempotency_keys",
    "expired_runs",
    "purged_runs",
    "purged_tombstones",
)
"""The sweep's steps, each a field of :class:`SweepCounts`, in the order they run: the
idempotency keys past retention go, and runs past it drop their snapshots, before the
tombstones those keys pinned and those snapshots held are weighed, so one pass removes
them all."""

SweepBatch = Callable[[], Awaitable[int | None]]
"""One batch of a sweep step, a transaction of its own: how many rows it removed, or None
when another process holds the sweep (a database several sidecars share)."""


async def sweep_steps(batches: Mapping[str, SweepBatch], batch_size: int) -> SweepCounts:
    """Run every step of :data:`SWEEP_STEPS`, each batch after batch until one removes
    fewer than ``batch_size`` rows, yielding to the loop in between (queued client writes
    go first). A failed batch ends its step, noted in ``errors``, and the next step runs;
    a batch that answers None ends the pass (another process is sweeping).

    :raises KeyError: ``batches`` lacks a step.
    """
    counts = SweepCounts()
    for name in SWEEP_STEPS:
        batch = batches[name]
        while True:
            try:
                removed = await batch()
            except MemoryServiceError as exc:
                counts.errors.append(f"{name}: {exc.details.get('reason', exc.code)}")
                break
            if removed is None:
                return counts
            setattr(counts, name, getattr(counts, name) + removed)
            if removed < batch_size:
                break
            await anyio.lowlevel.checkpoint()
    return counts


async def until_short(batch: Callable[[], Awaitable[tuple[int, int]]], batch_size: int) -> int:
    """Run ``batch`` (a transaction: how many rows it found, how many of them it removed)
    until it finds fewer than ``batch_size``, yielding to the loop in between; the rows
    removed in all. (Found and removed differ where another process may take rows between
    the finding and the removing.)

    :raises MemoryServiceError: a batch failed (the batches before it stay committed).
    """
    total = 0
    while True:
        found, removed = await batch()
        total += removed
        if found < batch_size:
            return total
        await anyio.lowlevel.checkpoint()
