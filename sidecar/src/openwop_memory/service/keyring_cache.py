"""The compiled keyring each put redacts with, compiled once per change, not per put.

A run's keyring is compiled from its own secrets merged over its tenant's host secrets
(the run's ids win) and kept on the run's handle with the host generation it was compiled
for; it is compiled again only when the run's secrets or the host's change. A run without
secrets of its own shares its tenant's host keyring, kept in a
:class:`~.keyring_memory.HostKeyringCache`. Every compiled keyring is charged to the
keyring budget (see ``keyring_memory.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, Protocol

from ..redaction import EMPTY_KEYRING, Keyring
from .keyring_memory import HostKeyringCache, KeyringCompiler
from .runs import RunHandle, RunRegistry


class HostSecrets(Protocol):
    """The host secrets as the service reads them (see ``secrets_directory.py``)."""

    @property
    def generation(self) -> int:
        """Changes whenever the loaded secrets change."""

    def values_for(self, tenant: str) -> Mapping[str, str]:
        """Value → secret id for ``tenant``'s runs: its own secrets and the host-wide ones."""

    @property
    def reloads(self) -> Mapping[str, int]:
        """Reloads after the first load, by outcome: ``changed``, ``unchanged``, ``failed``."""


class KeyringSource(NamedTuple):
    """What a run's keyring is compiled from."""

    generation: int  # of the host secrets merged into ``values``; -1: none were
    values: Mapping[str, str]  # value → secret id


class KeyringCache:
    """The keyrings of the runs in ``runs`` and of their tenants' host secrets."""

    def __init__(
        self, host_secrets: HostSecrets | None, compiler: KeyringCompiler, runs: RunRegistry
    ) -> None:
        self._host = host_secrets
        self._compiler = compiler
        self._runs = runs
        self._host_keyrings = HostKeyringCache(compiler)

    @property
    def host_keyrings_cached(self) -> int:
        return len(self._host_keyrings)

    def source(self, tenant: str, values: Mapping[str, str]) -> KeyringSource:
        """``values`` (a run's own secrets) merged over ``tenant``'s host secrets, with the
        host generation they come from: what the run's keyring is compiled from."""
        host = self._host
        if host is None or not values:
            return KeyringSource(-1, values)
        return KeyringSource(host.generation, {**host.values_for(tenant), **values})

    async def for_run(self, handle: RunHandle) -> Keyring:
        """The keyring ``handle``'s puts redact with: the one compiled for it if the host
        secrets have not changed since, else compiled now (and kept on the handle).

        :raises RateLimitedError: no room to compile it (see ``keyring_memory.py``).
        """
        host = self._host
        if not handle.values:
            if host is None:
                return EMPTY_KEYRING
            generation = host.generation
            return await self._host_keyrings.get(
                handle.tenant, generation, host.values_for(handle.tenant), handle.uid
            )
        if handle.keyring is not None and (host is None or handle.generation == host.generation):
            return handle.keyring
        values = handle.values
        generation, keyed = self.source(handle.tenant, values)
        with self._compiler.reserving(keyed, handle.tenant, handle.uid) as nbytes:
            keyring = await self._compiler.compile(keyed)
            if handle.values is values:  # else a merge compiled a newer one meanwhile
                handle.keyring, handle.generation = keyring, generation
                self._runs.charge(handle, nbytes)
        return keyring
