"""The memory compiled keyrings hold in this process, kept under ``max_keyring_memory_bytes``.

A compiled keyring is large (see :func:`~openwop_memory.redaction.estimate_bytes`) and
every open run may hold one, so their total is budgeted. Each holder (an open run's handle,
a tenant's cached host keyring) is charged its keyring's estimated size under a key; a
compile in progress holds a reservation for what it will produce. To make room, idle holders
are evicted: an evicted run is not lost (its next put answers ``not_found`` and the client
begins it again), an evicted host keyring is compiled again when next needed.

Eviction is fair between parties: each holder is charged to a party, a tenant within the
share of a Unix user (the peer uid that began the run; ``None`` for calls from no worker's
connection). Shares are split twice: a uid's share is the budget divided by the uids
holding keyrings (the one asking for room among them), and a tenant's share is its uid's
share divided by that uid's tenants holding keyrings. Room is taken only from a uid over
its share, the one holding the most (counting what the asker asks for), and within it only
from a tenant over its own share, the one holding the most, its least recently used idle
holder first. A tenant within its share is never evicted for another, however many tenant
names another process spreads its keyrings over (without tenant binding any process may
name any tenant; its uid is the kernel's): when only such parties could give room, the
request is ``rate_limited``. A party over its share that asks for more gives up its own
least recently used keyrings (a flood of runs of one tenant evicts that tenant's runs).
"""

from __future__ import annotations

import functools
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import anyio
import anyio.to_thread
from openwop_memory_client import RateLimitedError

from ..redaction import Keyring, estimate_bytes

# A keyring larger than the whole budget will not fit however long the client waits; it is
# told to come back late rather than soon.
_NEVER_FITS_RETRY_MS = 60_000
# Room is held by keyrings in use: a put lasts milliseconds.
_BUSY_RETRY_MS = 100
# A party: the uid whose share it is within, and the tenant (any hashable name).
_Party = tuple[int | None, Hashable]


@dataclass
class _Charge:
    nbytes: int
    # Drops the holder's keyring if it is idle; False when it is in use and must stay.
    evict: Callable[[], bool]
    party: _Party


class _Holders:
    """One party's holders in LRU order, and the bytes they hold."""

    __slots__ = ("keys", "nbytes")

    def __init__(self) -> None:
        self.keys: OrderedDict[Hashable, None] = OrderedDict()
        self.nbytes = 0


class KeyringBudget:
    """Estimated bytes of the compiled keyrings held, and their holders in LRU order, by
    party."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._charges: dict[Hashable, _Charge] = {}
        self._parties: dict[_Party, _Holders] = {}
        self._charged = 0
        self._reserved = 0
        # Compiles in progress count towards their party's share as its holders do.
        self._reserved_by: Counter[_Party] = Counter()
        self.evictions = 0

    @property
    def held(self) -> int:
        """Bytes charged plus bytes reserved by compiles in progress."""
        return self._charged + self._reserved

    def __len__(self) -> int:
        return len(self._charges)

    def party_bytes(self, tenant: Hashable, uid: int | None = None) -> int:
        """Bytes charged to the holders of ``tenant`` within ``uid``'s share."""
        held = self._parties.get((uid, tenant))
        return 0 if held is None else held.nbytes

    def touch(self, key: Hashable) -> None:
        """Mark ``key``'s holder as just used (evicted last)."""
        charge = self._charges.get(key)
        if charge is not None:
            self._parties[charge.party].keys.move_to_end(key)

    def charge(
        self,
        key: Hashable,
        nbytes: int,
        evict: Callable[[], bool],
        tenant: Hashable = None,
        uid: int | None = None,
    ) -> None:
        """``key`` holds ``nbytes`` from now on, for ``tenant`` within ``uid``'s share,
        replacing what it held before.

        Never evicts: room is made beforehand by :meth:`reserve`, whose reservation the
        caller holds until the charge is made.
        """
        self.release(key)
        party = (uid, tenant)
        self._charges[key] = _Charge(nbytes, evict, party)
        held = self._parties.get(party)
        if held is None:
            held = self._parties[party] = _Holders()
        held.keys[key] = None
        held.nbytes += nbytes
        self._charged += nbytes

    def move(self, key: Hashable, tenant: Hashable, uid: int | None) -> None:
        """Charge what ``key`` holds (if anything) to ``tenant`` within ``uid``'s share from
        now on, as just used."""
        charge = self._charges.get(key)
        if charge is not None:
            self.charge(key, charge.nbytes, charge.evict, tenant, uid)

    def release(self, key: Hashable) -> None:
        """``key`` holds nothing any more (its holder has dropped its keyring)."""
        charge = self._charges.pop(key, None)
        if charge is None:
            return
        self._charged -= charge.nbytes
        held = self._parties[charge.party]
        del held.keys[key]
        held.nbytes -= charge.nbytes
        if not held.keys:
            del self._parties[charge.party]

    @contextmanager
    def reserve(
        self, nbytes: int, tenant: Hashable = None, uid: int | None = None
    ) -> Iterator[None]:
        """Hold ``nbytes`` for a keyring of ``tenant`` (within ``uid``'s share) being
        compiled, evicting idle holders of parties over their fair share (see the module's
        docstring) until they fit.

        :raises RateLimitedError: ``nbytes`` alone is more than the budget, or holders in
            use, or parties within their share, fill it (``details.retryAfterMs``).
        """
        if nbytes > self.max_bytes:
            raise RateLimitedError(
                "the keyring needs more memory than the sidecar keeps for keyrings",
                {"retryAfterMs": _NEVER_FITS_RETRY_MS},
            )
        party = (uid, tenant)
        spared: set[_Party] = set()  # parties whose holders are all in use
        while self.held + nbytes > self.max_bytes:
            victim = self._over_share(party, nbytes, spared)
            if victim is None:
                break
            if not self._evict_one(victim):
                spared.add(victim)
        if self.held + nbytes > self.max_bytes:
            raise RateLimitedError(
                "keyring memory is taken by runs in use, keyrings being compiled and "
                "tenants within their share",
                {"retryAfterMs": _BUSY_RETRY_MS},
            )
        self._reserved += nbytes
        self._reserved_by[party] += nbytes
        try:
            yield
        finally:
            self._reserved -= nbytes
            self._reserved_by[party] -= nbytes
            if not self._reserved_by[party]:
                del self._reserved_by[party]

    def _over_share(self, asking: _Party, nbytes: int, spared: set[_Party]) -> _Party | None:
        """The party to take room from, not ``spared``: of the uids over their share, the
        one holding the most, and of its tenants over their share, the one holding the most
        (``asking`` counting ``nbytes`` more); None when there is none."""
        used = {name: held.nbytes for name, held in self._parties.items()}
        for name, reserved in self._reserved_by.items():
            used[name] = used.get(name, 0) + reserved
        used[asking] = used.get(asking, 0) + nbytes
        by_uid: dict[int | None, list[tuple[int, _Party]]] = {}
        for name, nbytes_used in used.items():
            by_uid.setdefault(name[0], []).append((nbytes_used, name))
        uid_share = self.max_bytes / len(by_uid)
        victim, most = None, uid_share
        for parties in by_uid.values():
            total = sum(held for held, _ in parties)
            if total <= most:
                continue
            share = uid_share / len(parties)
            # Only a party with holders can give room (the asker's may hold none yet).
            over = [
                (held, name)
                for held, name in parties
                if held > share and name in self._parties and name not in spared
            ]
            if over:
                victim, most = max(over, key=lambda pair: pair[0])[1], total
        return victim

    def _evict_one(self, party: _Party) -> bool:
        """Evict ``party``'s least recently used idle holder; False if all are in use."""
        for key in list(self._parties[party].keys):
            if self._charges[key].evict():
                self.release(key)
                self.evictions += 1
                return True
        return False


class KeyringCompiler:
    """Compiles keyrings in a worker thread, one at a time, under the budget's reservation.

    One at a time: compiling is mostly Python, so under the GIL a second compile thread would
    gain no speed and only add to what the event loop waits for.
    """

    def __init__(self, budget: KeyringBudget) -> None:
        self.budget = budget
        self._limiter: anyio.CapacityLimiter | None = None  # made inside the event loop

    @contextmanager
    def reserving(
        self, values: Mapping[str, str], tenant: Hashable = None, uid: int | None = None
    ) -> Iterator[int]:
        """Room for ``values``' keyring, of ``tenant`` within ``uid``'s share, held while
        the block runs; yields its size.

        :raises RateLimitedError: see :meth:`KeyringBudget.reserve`.
        """
        nbytes = estimate_bytes(values) if values else 0  # an empty keyring is never compiled
        with self.budget.reserve(nbytes, tenant, uid):
            yield nbytes

    async def compile(self, values: Mapping[str, str]) -> Keyring:
        """:meth:`Keyring.compile` off the event loop (call it inside :meth:`reserving`)."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(1)
        return await anyio.to_thread.run_sync(Keyring.compile, values, limiter=self._limiter)


class HostKeyringCache:
    """Compiled host keyrings of tenants whose runs registered no secrets of their own, one
    per tenant for the current host generation, at most ``max_entries``, charged to the
    budget and evicted from it like idle runs."""

    def __init__(self, compiler: KeyringCompiler, max_entries: int = 1024) -> None:
        self._compiler = compiler
        self._budget = compiler.budget
        self.max_entries = max_entries
        self._generation = -1
        self._keyrings: OrderedDict[str, Keyring] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keyrings)

    async def get(
        self, tenant: str, generation: int, values: Mapping[str, str], uid: int | None = None
    ) -> Keyring:
        """``tenant``'s host keyring (``values``, of host generation ``generation``); one
        compiled now is charged to ``tenant`` within ``uid``'s share (the caller's: the
        first to need it pays for it, as it would for a run's own keyring).

        :raises RateLimitedError: it cannot be given room (see :meth:`KeyringBudget.reserve`).
        """
        if generation != self._generation:
            for stale in self._keyrings:
                self._budget.release(("host", stale))
            self._keyrings.clear()
            self._generation = generation
        keyring = self._keyrings.get(tenant)
        if keyring is not None:
            self._keyrings.move_to_end(tenant)
            self._budget.touch(("host", tenant))
            return keyring
        with self._compiler.reserving(values, tenant, uid) as nbytes:
            keyring = await self._compiler.compile(values)
            if generation == self._generation:  # else a newer generation is being cached
                while len(self._keyrings) >= self.max_entries:
                    oldest, _ = self._keyrings.popitem(last=False)
                    self._budget.release(("host", oldest))
                self._keyrings[tenant] = keyring
                drop = functools.partial(self._drop, tenant)
                self._budget.charge(("host", tenant), nbytes, drop, tenant, uid)
        return keyring

    def _drop(self, tenant: str) -> bool:
        self._keyrings.pop(tenant, None)
        return True
