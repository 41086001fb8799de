"""Per-run handles held in process: tenant, snapshot, secrets and compiled keyring.

Secrets live only here, in memory, and go away at ``run.end`` (or when the handle is
evicted). An evicted run is not lost: its snapshot is persisted, and a put on it answers
``not_found`` so the client re-begins it with its secrets.

Handles are evicted for three reasons, each bounded per party (tenant):

- past ``max_open`` open runs, the least recently used run of the tenant holding the most
  runs goes: that tenant is over its fair share (``max_open`` over the tenants with open
  runs), so a tenant within its share never loses a run to another's flood, and a tenant
  flooding loses its own oldest runs rather than being refused (a run it re-uses is simply
  begun again, as after a restart);
- for keyring memory, as :class:`~.keyring_memory.KeyringBudget` decides (the same rule, in
  bytes);
- a run unused for ``idle_timeout`` seconds (a worker that crashed, or forgot ``run.end``)
  gives its memory back, so abandoned runs do not accumulate.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from openwop_memory_client import ValidationError
from openwop_memory_client.wire import MAX_SECRETS, SecretSpec

from ..redaction import Keyring
from ..storage.base import RunKey, Snapshot
from .keyring_memory import KeyringBudget


def merged_values(
    values: Mapping[str, str], secrets: list[SecretSpec], max_bytes: int
) -> dict[str, str] | None:
    """``values`` (value → id) with ``secrets`` added (the first id registered for a value
    wins), or None when nothing is new.

    :raises ValidationError: more than 256 secrets, more than ``max_bytes`` bytes of values
        in UTF-8 (``details.field`` ``secrets``; no value is ever named), or a new id
        contains a value.
    """
    merged = dict(values)
    for spec in secrets:
        merged.setdefault(spec.value, spec.id)
    if len(merged) > MAX_SECRETS:
        raise ValidationError(
            f"a run's keyring holds at most {MAX_SECRETS} secrets", {"field": "secrets"}
        )
    if len(merged) == len(values):
        return None
    if sum(len(value.encode()) for value in merged) > max_bytes:
        raise ValidationError(
            f"a run's secret values hold at most {max_bytes} bytes in UTF-8",
            {"field": "secrets", "maxRunSecretBytes": max_bytes},
        )
    # The id is written into every marker, so it must not carry any value of the keyring.
    # Each value is folded once, not once per id: that would be quadratic in the keyring's
    # size, on the event loop.
    folded = [value.casefold() for value in merged]
    for i, spec in enumerate(secrets):
        secret_id = spec.id.casefold()
        if any(value in secret_id for value in folded):
            raise ValidationError(
                "a secret id must not contain a secret value", {"field": f"secrets[{i}].id"}
            )
    return merged


@dataclass
class RunHandle:
    run_id: str
    tenant: str
    snapshot: Snapshot  # opaque: stored and handed back to storage unchanged
    snapshot_us: int
    # The run's own secrets, value → id. Replaced (never mutated) on a merge.
    values: Mapping[str, str]
    # The keyring redaction uses: ``values`` plus the tenant's host secrets, compiled for
    # host generation ``generation`` (-1: no host keyring). None until compiled, and while
    # the run has no secrets of its own (the tenant's shared host keyring serves it then).
    keyring: Keyring | None = None
    generation: int = -1
    # Requests working with the handle; it is not evicted for memory or idleness meanwhile.
    busy: int = 0
    # When it was last used (the registry's clock): what idleness is measured from.
    used_at: float = 0.0
    # What names the run: the registry's key, made once (it is read on every request).
    key: RunKey = field(init=False)

    def __post_init__(self) -> None:
        self.key = RunKey(self.tenant, self.run_id)


class _Largest:
    """How many runs each tenant holds, and one of the tenants holding the most, at O(1)
    per change (counts move by one, so the largest count falls by at most one at a time)."""

    def __init__(self) -> None:
        self._count: dict[str, int] = {}
        self._by_count: dict[int, dict[str, None]] = {}
        self.top = 0

    def count(self, tenant: str) -> int:
        return self._count.get(tenant, 0)

    def add(self, tenant: str) -> None:
        before = self._count.get(tenant, 0)
        self._move(tenant, before, before + 1)
        self.top = max(self.top, before + 1)

    def remove(self, tenant: str) -> None:
        before = self._count[tenant]
        self._move(tenant, before, before - 1)
        if self.top == before and before not in self._by_count:
            self.top -= 1

    def largest(self) -> str:
        """A tenant holding the most runs (call it with at least one run held)."""
        return next(iter(self._by_count[self.top]))

    def _move(self, tenant: str, before: int, after: int) -> None:
        if before:
            bucket = self._by_count[before]
            del bucket[tenant]
            if not bucket:
                del self._by_count[before]
        if after:
            self._count[tenant] = after
            self._by_count.setdefault(after, {})[tenant] = None
        else:
            del self._count[tenant]


class RunRegistry:
    """Open runs of this process, at most ``max_open``, each dropped after ``idle_timeout``
    seconds unused (``None``: never), their keyrings charged to ``budget`` (by tenant), which
    evicts idle ones to make room. See the module's docstring for who is evicted."""

    def __init__(
        self,
        max_open: int,
        budget: KeyringBudget,
        idle_timeout: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_open = max_open
        self.budget = budget
        self.idle_timeout = idle_timeout
        self._clock = clock
        # Every open run, least recently used first: idleness is read from the front.
        self._open: OrderedDict[RunKey, RunHandle] = OrderedDict()
        # Each tenant's open runs, least recently used first: evictions are taken from here.
        self._by_tenant: dict[str, OrderedDict[RunKey, None]] = {}
        # The open runs by id alone (run id -> tenant -> handle), for calls naming no tenant.
        self._by_id: dict[str, dict[str, RunHandle]] = {}
        self._counts = _Largest()
        self.evicted = 0
        self.idle_dropped = 0

    def __len__(self) -> int:
        self.drop_idle()
        return len(self._open)

    def get(self, key: RunKey) -> RunHandle | None:
        """The open run ``key`` (marked as just used), or None."""
        self.drop_idle()
        handle = self._open.get(key)
        if handle is not None:
            self.touch(handle)
        return handle

    def with_id(self, run_id: str) -> list[RunHandle]:
        """The open runs of this id, of every tenant (usually one), not marked as used."""
        self.drop_idle()
        by_tenant = self._by_id.get(run_id)
        return [] if by_tenant is None else list(by_tenant.values())

    def touch(self, handle: RunHandle) -> None:
        """Mark ``handle`` (open) as just used."""
        key = handle.key
        handle.used_at = self._clock()
        self._open.move_to_end(key)
        self._by_tenant[handle.tenant].move_to_end(key)
        self.budget.touch(("run", key))

    def add(self, handle: RunHandle) -> None:
        """Open ``handle``, replacing a handle of the same run; past ``max_open``, evict the
        least recently used run of the tenant holding the most (``handle``'s own tenant
        first when it is among them)."""
        self.drop_idle()
        key = handle.key
        self._remove(key)  # a handle it replaces
        handle.used_at = self._clock()
        self._open[key] = handle
        self._by_id.setdefault(handle.run_id, {})[handle.tenant] = handle
        self._by_tenant.setdefault(handle.tenant, OrderedDict())[key] = None
        self._counts.add(handle.tenant)
        while len(self._open) > self.max_open:
            counts = self._counts
            tenant = handle.tenant
            if counts.count(tenant) < counts.top:
                tenant = counts.largest()
            self._remove(next(iter(self._by_tenant[tenant])))
            self.evicted += 1

    def drop_idle(self) -> int:
        """Drop the runs unused for ``idle_timeout`` seconds (but those in use); how many."""
        if self.idle_timeout is None or not self._open:
            return 0
        horizon = self._clock() - self.idle_timeout
        idle: list[RunKey] = []
        for key, handle in self._open.items():
            if handle.used_at > horizon:
                break
            if not handle.busy:  # one in use past the bound (a long compile) stays
                idle.append(key)
        for key in idle:
            self._remove(key)
        self.idle_dropped += len(idle)
        return len(idle)

    def charge(self, handle: RunHandle, nbytes: int) -> None:
        """Charge ``handle``'s keyring (``nbytes``) to the budget, if it is still open."""
        key = handle.key
        if self._open.get(key) is handle:
            self.budget.charge(("run", key), nbytes, lambda: self._evict(handle), handle.tenant)

    def _evict(self, handle: RunHandle) -> bool:
        if handle.busy:
            return False
        if self._open.get(handle.key) is handle:
            self._remove(handle.key, release=False)
            self.evicted += 1
        return True

    def _remove(self, key: RunKey, *, release: bool = True) -> bool:
        """Close ``key`` here (and give back its keyring's charge, unless the budget is the
        one taking it); False if it was not open."""
        if release:
            self.budget.release(("run", key))
        handle = self._open.pop(key, None)
        if handle is None:
            return False
        by_tenant = self._by_id[handle.run_id]
        del by_tenant[handle.tenant]
        if not by_tenant:
            del self._by_id[handle.run_id]
        runs = self._by_tenant[handle.tenant]
        del runs[key]
        if not runs:
            del self._by_tenant[handle.tenant]
        self._counts.remove(handle.tenant)
        return True

    @contextmanager
    def using(self, handle: RunHandle) -> Iterator[RunHandle]:
        """Mark ``handle`` in use for the block: the budget does not evict it meanwhile."""
        handle.busy += 1
        try:
            yield handle
        finally:
            handle.busy -= 1

    def end(self, key: RunKey) -> bool:
        return self._remove(key)

    def keys(self) -> list[RunKey]:
        """The open runs, least recently used first."""
        self.drop_idle()
        return list(self._open)
