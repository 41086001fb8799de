"""Per-run handles held in process: tenant, snapshot, secrets and compiled keyring.

Secrets live only here, in memory, and go away at ``run.end`` (or when the handle is
evicted). An evicted run is not lost: its snapshot is persisted, and a put on it answers
``not_found`` so the client re-begins it with its secrets.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from openwop_memory_client import ValidationError
from openwop_memory_client.wire import MAX_SECRETS, SecretSpec

from ..redaction import Keyring
from ..storage.base import Snapshot
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
    # Requests working with the handle; it is not evicted for memory meanwhile.
    busy: int = 0


class RunRegistry:
    """Open runs of this process: past ``max_open`` the least recently used is evicted, and
    their keyrings are charged to ``budget``, which evicts idle ones to make room."""

    def __init__(self, max_open: int, budget: KeyringBudget) -> None:
        self.max_open = max_open
        self.budget = budget
        self._open: OrderedDict[str, RunHandle] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._open)

    def get(self, run_id: str) -> RunHandle | None:
        handle = self._open.get(run_id)
        if handle is not None:
            self._open.move_to_end(run_id)
            self.budget.touch(("run", run_id))
        return handle

    def add(self, handle: RunHandle) -> None:
        self._open[handle.run_id] = handle
        self._open.move_to_end(handle.run_id)
        self.budget.release(("run", handle.run_id))  # a handle it replaces
        while len(self._open) > self.max_open:
            run_id, _ = self._open.popitem(last=False)
            self.budget.release(("run", run_id))
            self.evicted += 1

    def charge(self, handle: RunHandle, nbytes: int) -> None:
        """Charge ``handle``'s keyring (``nbytes``) to the budget, if it is still open."""
        if self._open.get(handle.run_id) is handle:
            self.budget.charge(("run", handle.run_id), nbytes, lambda: self._evict(handle))

    def _evict(self, handle: RunHandle) -> bool:
        if handle.busy:
            return False
        if self._open.get(handle.run_id) is handle:
            del self._open[handle.run_id]
            self.evicted += 1
        return True

    @contextmanager
    def using(self, handle: RunHandle) -> Iterator[RunHandle]:
        """Mark ``handle`` in use for the block: the budget does not evict it meanwhile."""
        handle.busy += 1
        try:
            yield handle
        finally:
            handle.busy -= 1

    def end(self, run_id: str) -> bool:
        self.budget.release(("run", run_id))
        return self._open.pop(run_id, None) is not None

    def run_ids(self) -> list[str]:
        return list(self._open)
