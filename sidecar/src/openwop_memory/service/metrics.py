"""The sidecar's counters as Prometheus metrics (text exposition format 0.0.4).

Everything is read from what the sidecar counts anyway (:class:`~.stats.Stats`, the
keyring budget, the storage's :class:`~openwop_memory.storage.base.StorageGauges`) at the
moment of a scrape, so metrics add nothing to a request beyond ``Stats.observe``. Names
follow Prometheus conventions: a ``openwop_memory_`` prefix, base units in the name
(``_seconds``, ``_bytes``), ``_total`` on counters. No label carries a tenant, a run, a
ref or content: label values are method names and error codes, a closed set.

``prometheus_client`` is imported on the first scrape, so a sidecar nobody scrapes does not
load it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from .. import __version__
from ..storage.base import StorageGauges
from .stats import LATENCY_BUCKETS, KeyringGauges, Stats

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "openwop_memory_"


def render(
    stats: Stats,
    *,
    open_runs: int,
    keyrings: KeyringGauges,
    storage: StorageGauges | None,
    refs_rejected: int = 0,
    host_reloads: Mapping[str, int] | None = None,
) -> bytes:
    """The metrics page: the sidecar's own metrics, then the process's (memory, CPU, file
    descriptors, from ``/proc``). ``storage`` is ``None`` when the backend could not answer;
    ``openwop_memory_storage_up`` is then 0 and the storage gauges are left out."""
    from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

    class _Collector:
        def collect(self) -> Iterator[Metric]:
            return _families(stats, open_runs, keyrings, storage, refs_rejected, host_reloads)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    ProcessCollector(registry=registry)
    return generate_latest(registry)


def _families(
    stats: Stats,
    open_runs: int,
    keyrings: KeyringGauges,
    storage: StorageGauges | None,
    refs_rejected: int,
    host_reloads: Mapping[str, int] | None,
) -> Iterator[Metric]:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    def counter(name: str, doc: str, value: int) -> CounterMetricFamily:
        return CounterMetricFamily(PREFIX + name, doc, value=value)

    def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
        return GaugeMetricFamily(PREFIX + name, doc, value=value)

    info = GaugeMetricFamily(PREFIX + "build_info", "The sidecar's version.", labels=["version"])
    info.add_metric([__version__], 1)
    yield info

    requests = CounterMetricFamily(
        PREFIX + "requests",
        "Requests by method and outcome (ok, or the error code answered).",
        labels=["method", "outcome"],
    )
    for method, outcomes in sorted(stats.requests.items()):
        for outcome, n in sorted(outcomes.items()):
            requests.add_metric([method, outcome], n)
    yield requests

    durations = HistogramMetricFamily(
        PREFIX + "request_duration_seconds",
        "Time from a request's start to its answer, by method.",
        labels=["method"],
    )
    bounds = [*(repr(b) for b in LATENCY_BUCKETS), "+Inf"]
    for method, latency in sorted(stats.latency.items()):
        cumulative, running = [], 0
        for bound, n in zip(bounds, latency.buckets, strict=True):
            running += n
            cumulative.append((bound, running))
        durations.add_metric([method], cumulative, latency.total_seconds)
    yield durations

    yield gauge("open_runs", "Runs open in this process.", open_runs)
    yield counter("runs_evicted", "Open runs dropped to bound memory.", keyrings.runs_evicted)
    yield gauge(
        "keyring_memory_bytes", "Estimated memory of compiled keyrings.", keyrings.memory_bytes
    )
    yield gauge("host_keyrings", "Host keyrings cached.", keyrings.host_keyrings)

    def by(name: str, doc: str, label: str, counts: Mapping[str, int]) -> CounterMetricFamily:
        family = CounterMetricFamily(PREFIX + name, doc, labels=[label])
        for value, n in sorted(counts.items()):
            family.add_metric([value], n)
        return family

    yield by(
        "redactions", "Secrets redacted from entries before storage, once per field holding "
        "them, by kind: a registered secret as written (secret) or disguised (disguised), a "
        "credential format (pattern).", "kind", stats.redactions,
    )  # fmt: skip
    yield by(
        "refusals", "Puts refused with secret_leakage, by the kind of what refused them "
        "(survived: a secret left after rewriting).", "kind", stats.refusals,
    )  # fmt: skip
    if host_reloads is not None:
        yield by(
            "host_secrets_reloads", "Reloads of secrets_dir after the first load, by outcome "
            "(changed, unchanged, failed).", "outcome", host_reloads,
        )  # fmt: skip
    yield counter(
        "forgotten_entries", "Entries removed by forget (admin.forget).", stats.entries_forgotten
    )
    yield counter(
        "refs_rejected", "Issued memoryRefs that failed verification (forged, altered, or "
        "issued under another database's key).", refs_rejected,
    )  # fmt: skip
    yield counter("sweeps", "Sweeper passes.", stats.sweeps)
    yield counter("sweep_failures", "Sweeper passes that failed.", stats.sweep_failures)
    yield counter("swept_entries", "Expired entries the sweeper removed.", stats.entries_swept)
    yield counter(
        "purged_tombstones", "Deleted entries purged once no snapshot saw them.",
        stats.tombstones_purged,
    )  # fmt: skip
    yield counter(
        "expired_snapshots", "Run snapshots the sweeper let go past replay retention.",
        stats.snapshots_expired,
    )  # fmt: skip
    yield counter(
        "purged_run_markers", "Markers of runs past retention the sweeper removed.",
        stats.run_markers_purged,
    )  # fmt: skip
    yield counter(
        "purged_idempotency_keys", "Idempotency keys the sweeper removed.",
        stats.idempotency_keys_purged,
    )  # fmt: skip

    conns = stats.connections
    yield gauge("connections_open", "Client connections open.", conns.open)
    for name, doc, value in (
        ("connections_accepted", "Connections accepted.", conns.accepted),
        ("connections_refused", "Connections refused past max_connections.", conns.refused),
        ("connections_closed_idle", "Connections closed for idleness.", conns.closed_idle),
        (
            "connections_closed_partial_line",
            "Connections closed for a line left unfinished too long.",
            conns.closed_partial_line,
        ),
        ("accept_failures", "Accepts that failed for want of descriptors.", conns.accept_failures),
        ("read_pauses", "Times a client's unread answers paused its reading.", conns.read_pauses),
    ):
        yield counter(name, doc, value)

    yield gauge(
        "storage_up",
        "1 when the storage answered this scrape, else 0.",
        0 if storage is None else 1,
    )
    if storage is None:
        return
    sizes: tuple[tuple[str, str, int | None], ...] = (
        ("database_bytes", "Size of the database (SQLite: the main file).", storage.database_bytes),
        ("wal_bytes", "Size of SQLite's write-ahead log.", storage.wal_bytes),
        ("entries", "Live entries (neither deleted nor expired), exactly.", storage.entries),
        ("scopes", "Scopes stored, exactly.", storage.scopes),
        (
            "entries_estimate",
            "Entry rows stored (deleted and unswept expired ones included), as estimated by "
            "PostgreSQL's planner at its last ANALYZE.",
            storage.entries_estimate,
        ),
        (
            "scopes_estimate",
            "Scopes stored, as estimated by PostgreSQL's planner at its last ANALYZE.",
            storage.scopes_estimate,
        ),
    )
    for name, doc, size in sizes:
        if size is not None:
            yield gauge(name, doc, size)
    if storage.commits is not None:
        yield counter("commits", "Write transactions this process committed.", storage.commits)
    if storage.committed_writes is not None:
        yield counter(
            "committed_writes",
            "Writes those transactions carried (over commits: the group-commit batch size).",
            storage.committed_writes,
        )
    if storage.batch_sizes is not None and storage.committed_writes is not None:
        batches = HistogramMetricFamily(
            PREFIX + "commit_batch_size", "Writes a group commit carried, per commit."
        )
        buckets: list[tuple[str, float]] = []
        total = 0
        for upper, n in storage.batch_sizes:
            total += n
            buckets.append(("+Inf" if upper is None else str(upper), total))
        batches.add_metric([], buckets, storage.committed_writes)
        yield batches
