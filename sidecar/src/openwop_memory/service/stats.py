"""Content-free counters for ``sidecar.stats``."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class KeyringGauges:
    """What compiled keyrings hold right now, and how many runs were dropped to bound it."""

    memory_bytes: int  # estimated, charged plus reserved (see keyring_memory.py)
    host_keyrings: int  # cached host keyrings
    runs_evicted: int  # open runs dropped past max_open_runs or max_keyring_memory_bytes


@dataclass
class ConnectionStats:
    """What happened to connections (the wire layer counts, ``sidecar.stats`` shows)."""

    open: int = 0
    accepted: int = 0
    refused: int = 0  # beyond max_connections: answered rate_limited and closed
    closed_idle: int = 0
    closed_partial_line: int = 0
    accept_failures: int = 0  # accept attempts that failed for want of file descriptors
    read_pauses: int = 0  # times a connection's unread answers stopped its reading

    def snapshot(self) -> dict[str, int]:
        return {
            "open": self.open,
            "accepted": self.accepted,
            "refused": self.refused,
            "closedIdle": self.closed_idle,
            "closedPartialLine": self.closed_partial_line,
            "acceptFailures": self.accept_failures,
            "readPauses": self.read_pauses,
        }


@dataclass
class Stats:
    requests: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    redactions_applied: int = 0
    entries_swept: int = 0
    tombstones_purged: int = 0
    sweeps: int = 0
    sweep_failures: int = 0
    connections: ConnectionStats = field(default_factory=ConnectionStats)

    def count(self, method: str, outcome: str) -> None:
        """Count one request of ``method`` that ended in ``outcome`` (``ok`` or an error code)."""
        self.requests[method][outcome] += 1

    def snapshot(self, active_runs: int, keyrings: KeyringGauges) -> dict[str, object]:
        return {
            "requests": {m: dict(c) for m, c in sorted(self.requests.items())},
            "activeRuns": active_runs,
            "keyringMemoryBytes": keyrings.memory_bytes,
            "hostKeyringsCached": keyrings.host_keyrings,
            "runsEvicted": keyrings.runs_evicted,
            "entriesSwept": self.entries_swept,
            "tombstonesPurged": self.tombstones_purged,
            "sweeps": self.sweeps,
            "sweepFailures": self.sweep_failures,
            "redactionsApplied": self.redactions_applied,
            "connections": self.connections.snapshot(),
        }
