"""What an operator may see of the memory, and do to it, over the admin socket only: the
runs, what one run's snapshot sees, a tenant's scopes, an entry by id, a backup of the
database, and forgetting a subject.

These cross tenants by design (an operator debugging an agent run needs exactly that), so
:mod:`openwop_memory.wire.admin` serves them on a socket of their own, never on the
workers'. Content is shown as stored: already redacted. Scopes are shown by their stored
key (``issued:…`` or ``plain:…``), which names no agent and no plain ref.
"""

from __future__ import annotations

import os
import time
from typing import Any

import structlog
from openwop_memory_client import NotFoundError, ValidationError

from ..storage.base import FileBackup, Storage
from ..timefmt import format_us
from .memory import MemoryService, entry_to_wire

SUBJECT_TAG_PREFIX = "subject:"
"""An entry is about subject ``S`` when it carries the tag ``subject:S`` (what forget removes)."""

log = structlog.get_logger("openwop_memory.admin")


class Inspector:
    """The operator's view of one sidecar's memory (see the module)."""

    def __init__(
        self,
        service: MemoryService,
        storage: Storage,
        *,
        max_list_limit: int,
        forget_batch: int = 500,
    ) -> None:
        self._service = service
        self._storage = storage
        self._max_list_limit = max_list_limit
        self._forget_batch = forget_batch

    async def runs(self, limit: int) -> list[dict[str, Any]]:
        """Stored runs, the most recently touched first, marked when open in this process."""
        open_here = set(self._service.open_runs())
        return [
            {
                "runId": run.run_id,
                "tenant": run.tenant,
                "snapshotAt": format_us(run.snapshot_us),
                "touchedAt": format_us(run.touched_us),
                "retained": run.retained,
                "openHere": (run.tenant, run.run_id) in open_here,
            }
            for run in await self._storage.list_runs(limit=limit)
        ]

    async def run(self, run_id: str) -> dict[str, Any]:
        """What the run's snapshot sees, scope by scope, each as the run's own
        ``memory.list`` (at the largest limit) would return it now. Scopes where it sees
        nothing are left out.

        :raises RunNotFoundError: no such run within retention.
        """
        run = await self._service.find_run(run_id)
        storage = self._storage
        now = storage.clock_us()
        scopes = []
        for info in await storage.list_scopes(tenant=run.tenant, now_us=now):
            rows = await storage.list(
                scope=info.scope,
                snapshot=run.snapshot,
                now_us=now,
                limit=self._max_list_limit,
                tag=None,
            )
            if rows:
                scopes.append(
                    {"scope": info.scope.key, "entries": [entry_to_wire(r) for r in rows]}
                )
        return {
            "runId": run_id,
            "tenant": run.tenant,
            "snapshotAt": format_us(run.snapshot_us),
            "scopes": scopes,
        }

    async def diff(self, first: str, second: str) -> dict[str, Any]:
        """What changed between two runs' snapshots of one tenant, scope by scope, the
        earlier run as ``from`` (the two are swapped if ``second`` is the earlier): the
        entries the later sees and the earlier does not (``added``), and those the earlier
        saw and the later does not, ``superseded`` (with the id of the revision that
        replaced each) or ``deleted``. What expired or was forgotten is in neither view.
        A scope is compared on the first ``max_list_limit`` entries each run sees, newest
        first; ``truncated`` says a side held more. Scopes with no change are left out.

        :raises RunNotFoundError: either run is not within retention.
        :raises ConflictError: a run id names runs of several tenants.
        :raises ValidationError: the runs are of different tenants (field ``to``).
        """
        older = await self._service.find_run(first)
        newer = await self._service.find_run(second)
        if older.tenant != newer.tenant:
            raise ValidationError("the two runs are of different tenants", {"field": "to"})
        if (older.snapshot_us, older.snapshot) > (newer.snapshot_us, newer.snapshot):
            older, newer = newer, older
        storage = self._storage
        now = storage.clock_us()
        scopes = []
        for info in await storage.list_scopes(tenant=older.tenant, now_us=now):
            limit = self._max_list_limit
            before, after = [
                await storage.list(
                    scope=info.scope, snapshot=run.snapshot, now_us=now, limit=limit, tag=None
                )
                for run in (older, newer)
            ]
            seen_before = {row.id for row in before}
            seen_after = {row.id for row in after}
            added = [entry_to_wire(row) for row in after if row.id not in seen_before]
            superseded, deleted = [], []
            for row in before:
                if row.id in seen_after:
                    continue
                found = await storage.find_entry(entry_id=row.id)
                if found is not None and found.superseded_by is not None:
                    superseded.append({"entry": entry_to_wire(row), "by": found.superseded_by})
                else:
                    deleted.append(entry_to_wire(row))
            if added or superseded or deleted:
                scopes.append(
                    {
                        "scope": info.scope.key,
                        "added": added,
                        "superseded": superseded,
                        "deleted": deleted,
                        "truncated": limit in (len(before), len(after)),
                    }
                )
        return {
            "tenant": older.tenant,
            "from": {"runId": older.run_id, "snapshotAt": format_us(older.snapshot_us)},
            "to": {"runId": newer.run_id, "snapshotAt": format_us(newer.snapshot_us)},
            "scopes": scopes,
        }

    async def scopes(self, tenant: str) -> list[dict[str, Any]]:
        """The tenant's scopes with their live entries now."""
        infos = await self._storage.list_scopes(tenant=tenant, now_us=self._storage.clock_us())
        return [{"scope": i.scope.key, "liveEntries": i.live_entries} for i in infos]

    async def entry(self, entry_id: str) -> dict[str, Any]:
        """The entry with this id, whatever its tenant, with its tenant, scope and whether
        it is deleted.

        :raises NotFoundError: no entry has this id (any more).
        """
        found = await self._storage.find_entry(entry_id=entry_id)
        if found is None:
            raise NotFoundError("no entry has this id", {"id": entry_id})
        return {
            "tenant": found.scope.tenant,
            "scope": found.scope.key,
            "deleted": found.deleted,
            "entry": entry_to_wire(found.entry),
        }

    async def backup(self, path: str) -> dict[str, Any]:
        """A consistent copy of the database at ``path`` (a new file), checked; its size
        and how long it took.

        :raises ValidationError: ``path`` is not absolute, exists, or its directory does
            not or is on a file system read-only for this process; or the backend has no
            such backup (PostgreSQL: use its own tools; an in-memory database has no file).
        :raises UpstreamUnavailableError: the copy failed or did not pass its check.
        """
        if not os.path.isabs(path):
            raise ValidationError("the backup path must be absolute", {"field": "path"})
        if os.path.lexists(path):  # noqa: ASYNC240 - a stat, not a read
            raise ValidationError("the backup path exists; choose a new one", {"field": "path"})
        if not os.path.isdir(os.path.dirname(path)):  # noqa: ASYNC240 - a stat
            raise ValidationError("the backup path's directory does not exist", {"field": "path"})
        if _read_only(os.path.dirname(path)):
            raise ValidationError(
                "the backup path's directory is read-only for the sidecar (a service sandbox "
                "such as systemd's ProtectSystem=strict leaves it only its own directories: "
                "use one it may write, such as /var/lib/openwop-memory/backups, or a mounted "
                "volume in a Pod)",
                {"field": "path"},
            )
        if not isinstance(self._storage, FileBackup):
            raise ValidationError(
                "backup copies a SQLite database; back up PostgreSQL with its own tools "
                "(pg_dump, or your provider's snapshots); an in-memory database "
                "(memory://) has no file and goes with the sidecar's process",
                {"field": "path"},
            )
        started = time.monotonic()
        size = await self._storage.backup(path=path)
        return {"path": path, "bytes": size, "seconds": round(time.monotonic() - started, 3)}

    async def forget(self, tenant: str, subject: str) -> dict[str, Any]:
        """Remove every entry of ``tenant`` tagged ``subject:<subject>``, in every scope of
        the tenant, for good: older snapshots stop seeing them too (RFC 0080 puts forget
        outside the replay envelope). Returns how many entries went.

        The log line names the tenant and the count, not the subject: a subject id is often
        a person's identifier, which a forget should not leave behind in the logs.

        :raises UpstreamUnavailableError: the database failed; the batches committed before
            stay forgotten, and the same forget again removes the rest.
        """
        started = time.monotonic()
        count = await self._storage.forget(
            tenant=tenant, tag=SUBJECT_TAG_PREFIX + subject, batch_size=self._forget_batch
        )
        seconds = round(time.monotonic() - started, 3)
        self._service.stats.entries_forgotten += count
        log.info("subject_forgotten", tenant=tenant, forgotten=count, seconds=seconds)
        return {"tenant": tenant, "subject": subject, "forgotten": count, "seconds": seconds}


def _read_only(directory: str) -> bool:
    """Whether ``directory`` is on a file system mounted read-only in this process's view
    (what ``ProtectSystem=strict`` makes of everything but the service's directories)."""
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False
