"""Domain rules every storage backend shares, so no backend defines them for itself.

The entry-id format and the horizons of retention live here; a backend applies them (it
assigns ids inside its transaction and deletes what a horizon says may go) but never
decides them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


class NotNow:
    """The type of :data:`NOT_NOW`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_NOW"


NOT_NOW = NotNow()
"""What a ``*_now`` method returns when it cannot answer without waiting: the caller then
takes the method's asynchronous form, which always answers."""

# Run markers (a run whose snapshot is past retention) stay this many retentions, so a late
# replay can still be told "retention_expired" rather than "unknown_run".
MARKER_RETENTIONS = 4


def new_entry_id(created_us: int) -> str:
    """A unique, opaque entry id that sorts by creation time: ``mem_`` followed by the
    creation time (13 hex digits of µs) and 80 random bits (20 hex digits).

    Random ids land on random pages of an id index, so every commit dirtied a page per
    entry; time-ordered ids append. The time part reveals nothing that createdAt does not,
    and the random bits keep ids from different sidecars apart.
    """
    return f"mem_{created_us:013x}{os.urandom(10).hex()}"


def retention_cutoff_us(now_us: int, retention_us: int) -> int:
    """A run last touched at or before this time is past retention (its snapshot is gone)."""
    return now_us - retention_us


@dataclass(frozen=True, slots=True)
class SweepHorizons:
    """What one sweep may remove, as times in µs since the epoch (each inclusive).

    ``now_us``: entries that expired at or before it. ``run_cutoff_us``: snapshots of runs
    last touched at or before it. ``marker_cutoff_us``: run markers (runs without a snapshot)
    last touched at or before it. ``key_cutoff_us``: idempotency keys created at or before it.
    """

    now_us: int
    run_cutoff_us: int
    marker_cutoff_us: int
    key_cutoff_us: int

    @classmethod
    def at(cls, now_us: int, retention_us: int) -> SweepHorizons:
        """The horizons of a sweep at ``now_us`` under a replay retention of ``retention_us``.

        Idempotency keys are kept exactly as long as snapshots (the replay retention).
        """
        cutoff = retention_cutoff_us(now_us, retention_us)
        return cls(
            now_us=now_us,
            run_cutoff_us=cutoff,
            marker_cutoff_us=now_us - MARKER_RETENTIONS * retention_us,
            key_cutoff_us=cutoff,
        )
