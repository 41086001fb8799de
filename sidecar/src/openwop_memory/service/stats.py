"""Content-free counters for ``sidecar.stats``."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field


@dataclass
class Stats:
    requests: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    redactions_applied: int = 0
    entries_swept: int = 0
    tombstones_purged: int = 0
    sweeps: int = 0
    sweep_failures: int = 0

    def count(self, method: str, outcome: str) -> None:
        """Count one request of ``method`` that ended in ``outcome`` (``ok`` or an error code)."""
        self.requests[method][outcome] += 1

    def snapshot(self, active_runs: int) -> dict[str, object]:
        return {
            "requests": {m: dict(c) for m, c in sorted(self.requests.items())},
            "activeRuns": active_runs,
            "entriesSwept": self.entries_swept,
            "tombstonesPurged": self.tombstones_purged,
            "sweeps": self.sweeps,
            "sweepFailures": self.sweep_failures,
            "redactionsApplied": self.redactions_applied,
        }
