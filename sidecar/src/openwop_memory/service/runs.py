"""Per-run handles held in process: tenant, snapshot and compiled keyring.

Secrets live only here, in memory, and go away at ``run.end`` (or when the handle is
evicted). An evicted run is not lost: its snapshot is persisted, and a put on it answers
``not_found`` so the client re-begins it with its secrets.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import anyio.to_thread
from openwop_memory_client import ValidationError
from openwop_memory_client.wire import MAX_SECRETS, SecretSpec

from ..storage.base import Snapshot
from .redaction import Keyring


def merged_values(keyring: Keyring, secrets: list[SecretSpec]) -> dict[str, str] | None:
    """``keyring``'s values with ``secrets`` added (the first id registered for a value wins),
    or None when nothing is new.

    :raises ValidationError: more than 256 secrets, or a new id contains a value.
    """
    merged = dict(keyring.ids_by_value)
    for spec in secrets:
        merged.setdefault(spec.value, spec.id)
    if len(merged) > MAX_SECRETS:
        raise ValidationError(
            f"a run's keyring holds at most {MAX_SECRETS} secrets", {"field": "secrets"}
        )
    if len(merged) == len(keyring):
        return None
    # The id is written into every marker, so it must not carry any value of the keyring.
    # Each value is folded once: folding all of them per id took 1.5 s of the event loop
    # for 256 values of 4,096 characters.
    values = [value.casefold() for value in merged]
    for i, spec in enumerate(secrets):
        secret_id = spec.id.casefold()
        if any(value in secret_id for value in values):
            raise ValidationError(
                "a secret id must not contain a secret value", {"field": f"secrets[{i}].id"}
            )
    return merged


async def compile_keyring(values: Mapping[str, str]) -> Keyring:
    """:meth:`Keyring.compile` in a worker thread: it takes milliseconds per secret, and the
    event loop must go on serving other runs meanwhile."""
    return await anyio.to_thread.run_sync(Keyring.compile, values)


async def grown(keyring: Keyring, secrets: list[SecretSpec]) -> Keyring:
    """``keyring`` with ``secrets`` added, compiled (``keyring`` itself if nothing is new).

    :raises ValidationError: see :func:`merged_values`.
    """
    merged = merged_values(keyring, secrets)
    return keyring if merged is None else await compile_keyring(merged)


@dataclass
class RunHandle:
    run_id: str
    tenant: str
    snapshot: Snapshot  # opaque: stored and handed back to storage unchanged
    snapshot_us: int
    keyring: Keyring
    # (host keyring generation, run keyring, both compiled together), see MemoryService.
    combined: tuple[int, Keyring, Keyring] | None = None


class RunRegistry:
    """Open runs of this process, least recently used evicted past ``max_open``."""

    def __init__(self, max_open: int) -> None:
        self.max_open = max_open
        self._open: OrderedDict[str, RunHandle] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def get(self, run_id: str) -> RunHandle | None:
        handle = self._open.get(run_id)
        if handle is not None:
            self._open.move_to_end(run_id)
        return handle

    def add(self, handle: RunHandle) -> None:
        self._open[handle.run_id] = handle
        self._open.move_to_end(handle.run_id)
        while len(self._open) > self.max_open:
            self._open.popitem(last=False)

    def end(self, run_id: str) -> bool:
        return self._open.pop(run_id, None) is not None

    def run_ids(self) -> list[str]:
        return list(self._open)
