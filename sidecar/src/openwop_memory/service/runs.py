"""Per-run handles held in process: tenant, snapshot, secrets and compiled keyring.

Secrets live only here, in memory, and go away at ``run.end`` (or when the handle is
evicted). An evicted run is not lost: its snapshot is persisted, and a put on it answers
``not_found`` so the client re-begins it with its secrets.

Handles are evicted for three reasons, each bounded per party:

- past ``max_open`` open runs, a run of the party most over its fair share goes. Shares are
  split twice: first between the Unix users (peer uids) that began open runs, then, within
  a user's share, between the tenants it holds runs of. The run taken is the least recently
  used one of the tenant holding the most runs of the user holding the most: that user is
  over its share (``max_open`` over the users with open runs) and that tenant over its own
  (the user's share over the user's tenants), so a tenant within its share never loses a
  run to another's flood, even one spread over many tenant names by one process (the
  names are free to choose without tenant binding; the uid is the kernel's). A party
  flooding loses its own oldest runs rather than being refused (a run it re-uses is simply
  begun again, as after a restart);
- for keyring memory, as :class:`~.keyring_memory.KeyringBudget` decides (the same rule, in
  bytes);
- a run unused for ``idle_timeout`` seconds (a worker that crashed, or forgot ``run.end``)
  gives its memory back, so abandoned runs do not accumulate.

A run is charged to the uid that began it last: a ``run.begin`` of an open run by another
user moves the run (and its keyring's bytes) to that user's share. That gives the second
user nothing it did not have: a process that may name the run's tenant may end the run.
The uid is ``None`` for calls that come from no worker's connection (the admin socket; a
connection the kernel gave no credentials for): they form a party of their own.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from openwop_memory_client import ValidationError
from openwop_memory_client.wire import MAX_SECRETS, SecretSpec

from ..redaction import Keyring
from ..storage.base import RunKey, Snapshot
from .keyring_memory import KeyringBudget

_K = TypeVar("_K", bound=Hashable)
# Who an open run is charged to: the uid that began it (None: no worker's connection), and
# its tenant within that uid's share.
Party = tuple[int | None, str]


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
    # The Unix user (peer uid) that began the run last, whose share it is charged to.
    uid: int | None = None
    # What names the run: the registry's key, made once (it is read on every request).
    key: RunKey = field(init=False)

    def __post_init__(self) -> None:
        self.key = RunKey(self.tenant, self.run_id)

    @property
    def party(self) -> Party:
        """Who the run is charged to: its uid, then its tenant within that uid's share."""
        return (self.uid, self.tenant)


class _Largest(Generic[_K]):
    """How many runs each holder (a uid, or a tenant of one uid) holds, and one of the
    holders holding the most, at O(1) per change (counts move by one, so the largest count
    falls by at most one at a time)."""

    def __init__(self) -> None:
        self._count: dict[_K, int] = {}
        self._by_count: dict[int, dict[_K, None]] = {}
        self.top = 0

    def __bool__(self) -> bool:
        return bool(self._count)

    def add(self, holder: _K) -> None:
        before = self._count.get(holder, 0)
        self._move(holder, before, before + 1)
        self.top = max(self.top, before + 1)

    def remove(self, holder: _K) -> None:
        before = self._count[holder]
        self._move(holder, before, before - 1)
        if self.top == before and before not in self._by_count:
            self.top -= 1

    def largest(self) -> _K:
        """One holder holding the most runs (call it with at least one run held)."""
        return next(iter(self._by_count[self.top]))

    def largest_for(self, adding: _K) -> _K:
        """``adding`` (the holder of the run being added) if it holds the most runs and
        more than that one run, else another holder holding the most: never one whose only
        run is the one being added (call it with a run held besides that one)."""
        top = self.top
        if self._count.get(adding, 0) != top:
            return self.largest()
        if top > 1:
            return adding
        return next(holder for holder in self._by_count[top] if holder != adding)

    def _move(self, holder: _K, before: int, after: int) -> None:
        if before:
            bucket = self._by_count[before]
            del bucket[holder]
            if not bucket:
                del self._by_count[before]
        if after:
            self._count[holder] = after
            self._by_count.setdefault(after, {})[holder] = None
        else:
            del self._count[holder]


class _Counts:
    """Open runs counted by uid, and by tenant within each uid: who eviction takes from."""

    def __init__(self) -> None:
        self._uids: _Largest[int | None] = _Largest()
        self._tenants: dict[int | None, _Largest[str]] = {}

    def add(self, party: Party) -> None:
        uid, tenant = party
        self._uids.add(uid)
        tenants = self._tenants.get(uid)
        if tenants is None:
            tenants = self._tenants[uid] = _Largest()
        tenants.add(tenant)

    def remove(self, party: Party) -> None:
        uid, tenant = party
        self._uids.remove(uid)
        tenants = self._tenants[uid]
        tenants.remove(tenant)
        if not tenants:
            del self._tenants[uid]

    def most_over_share(self, adding: Party) -> Party:
        """The tenant holding the most runs of the uid holding the most: ``adding``'s (the
        party of the run being added) when they are among them, but never a party whose
        only run is that one (call it with more runs held than one)."""
        uid = self._uids.largest_for(adding[0])
        tenants = self._tenants[uid]
        return (uid, tenants.largest_for(adding[1]) if uid == adding[0] else tenants.largest())


class InUse:
    """``with``: ``handle`` is marked in use for the block (see :meth:`RunRegistry.using`).
    A class, not ``contextlib.contextmanager``: every put enters one, and a generator's
    frames cost it twice as much."""

    __slots__ = ("_handle",)

    def __init__(self, handle: RunHandle) -> None:
        self._handle = handle

    def __enter__(self) -> RunHandle:
        self._handle.busy += 1
        return self._handle

    def __exit__(self, *exc: object) -> None:
        self._handle.busy -= 1


class RunRegistry:
    """Open runs of this process, at most ``max_open``, each dropped after ``idle_timeout``
    seconds unused (``None``: never), their keyrings charged to ``budget`` (by uid and
    tenant), which evicts idle ones to make room. See the module's docstring for who is
    evicted."""

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
        # Each party's open runs, least recently used first: evictions are taken from here.
        self._by_party: dict[Party, OrderedDict[RunKey, None]] = {}
        # The open runs by id alone (run id -> tenant -> handle), for calls naming no tenant.
        self._by_id: dict[str, dict[str, RunHandle]] = {}
        self._counts = _Counts()
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
        self._by_party[handle.party].move_to_end(key)
        self.budget.touch(("run", key))

    def add(self, handle: RunHandle) -> None:
        """Open ``handle``, replacing a handle of the same run; past ``max_open``, evict the
        least recently used run of the tenant holding the most of the uid holding the most
        (``handle``'s own uid and tenant first when they are among them)."""
        self.drop_idle()
        key = handle.key
        self._remove(key)  # a handle it replaces
        handle.used_at = self._clock()
        self._open[key] = handle
        self._by_id.setdefault(handle.run_id, {})[handle.tenant] = handle
        self._enter(handle)
        while len(self._open) > self.max_open:
            party = self._counts.most_over_share(handle.party)
            self._remove(next(iter(self._by_party[party])))
            self.evicted += 1

    def claim(self, handle: RunHandle, uid: int | None) -> None:
        """Charge open ``handle`` (and its keyring's bytes) to ``uid`` from now on: ``uid``
        began it again (see the module's docstring)."""
        if handle.uid == uid or self._open.get(handle.key) is not handle:
            return
        self._leave(handle)
        handle.uid = uid
        self._enter(handle)
        self.budget.move(("run", handle.key), handle.tenant, uid)

    def _enter(self, handle: RunHandle) -> None:
        party = handle.party
        self._by_party.setdefault(party, OrderedDict())[handle.key] = None
        self._counts.add(party)

    def _leave(self, handle: RunHandle) -> None:
        party = handle.party
        runs = self._by_party[party]
        del runs[handle.key]
        if not runs:
            del self._by_party[party]
        self._counts.remove(party)

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
            self.budget.charge(
                ("run", key), nbytes, lambda: self._evict(handle), handle.tenant, handle.uid
            )

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
        self._leave(handle)
        return True

    @staticmethod
    def using(handle: RunHandle) -> InUse:
        """Mark ``handle`` in use for the block: the budget does not evict it meanwhile."""
        return InUse(handle)

    def end(self, key: RunKey) -> bool:
        return self._remove(key)

    def keys(self) -> list[RunKey]:
        """The open runs, least recently used first."""
        self.drop_idle()
        return list(self._open)
