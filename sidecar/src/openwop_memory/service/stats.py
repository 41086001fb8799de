"""Content-free counters for ``sidecar.stats`` and the Prometheus metrics."""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, defaultdict
from dataclasses import dataclass, field

# Upper bounds (seconds, inclusive) of the request-duration histogram's buckets; a last,
# unbounded bucket follows. From a cached get (tens of µs) to a stalled disk (seconds).
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)  # fmt: skip


@dataclass
class Latency:
    """One method's request durations: per-bucket counts (not cumulative; the last is
    the unbounded bucket) and their sum in seconds."""

    buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total_seconds: float = 0.0


@dataclass(frozen=True)
class KeyringGauges:
    """What compiled keyrings hold right now, and how many runs were dropped to bound it."""

    memory_bytes: int  # estimated, charged plus reserved (see keyring_memory.py)
    host_keyrings: int  # cached host keyrings
    runs_evicted: int  # open runs dropped past max_open_runs or max_keyring_memory_bytes
    runs_idle_dropped: int = 0  # open runs dropped unused for run_idle_timeout


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
    # Redacted occurrences by kind: a registered secret written as it is ("secret") or
    # disguised ("disguised"), a credential format ("pattern"); refused puts by the kind
    # of what refused them ("survived": a secret left after rewriting).
    redactions: Counter[str] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)
    entries_swept: int = 0
    tombstones_purged: int = 0
    snapshots_expired: int = 0
    run_markers_purged: int = 0
    idempotency_keys_purged: int = 0
    entries_forgotten: int = 0
    sweeps: int = 0
    sweep_failures: int = 0
    connections: ConnectionStats = field(default_factory=ConnectionStats)
    latency: defaultdict[str, Latency] = field(default_factory=lambda: defaultdict(Latency))

    def count(self, method: str, outcome: str) -> None:
        """Count one request of ``method`` that ended in ``outcome`` (``ok`` or an error code)."""
        self.requests[method][outcome] += 1

    def observe(self, method: str, outcome: str, seconds: float) -> None:
        """:meth:`count`, and the request's duration in ``method``'s histogram."""
        self.requests[method][outcome] += 1
        latency = self.latency[method]
        latency.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        latency.total_seconds += seconds

    def snapshot(self, active_runs: int, keyrings: KeyringGauges) -> dict[str, object]:
        return {
            "requests": {m: dict(c) for m, c in sorted(self.requests.items())},
            "activeRuns": active_runs,
            "keyringMemoryBytes": keyrings.memory_bytes,
            "hostKeyringsCached": keyrings.host_keyrings,
            "runsEvicted": keyrings.runs_evicted,
            "runsIdleDropped": keyrings.runs_idle_dropped,
            "entriesSwept": self.entries_swept,
            "tombstonesPurged": self.tombstones_purged,
            "sweeps": self.sweeps,
            "sweepFailures": self.sweep_failures,
            "redactionsApplied": self.redactions_applied,
            "connections": self.connections.snapshot(),
        }
