"""The bystander of the "under attack" table: a tenant minding its own business, whose gets
are measured while another party attacks the sidecar."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from dataclasses import dataclass, field

from bench.lean_client import LeanClient, ProtocolFailure, RpcError
from bench.sidecar_bench import Content, SidecarUnderTest

TENANT = "bystander"


@dataclass
class Gets:
    latencies: list[float] = field(default_factory=list)  # seconds of the gets served
    problems: Counter[str] = field(default_factory=Counter)  # error codes, timeouts, drops


class Bystander:
    """A tenant minding its own business: a scope of its own, a run begun after its puts,
    and one connection doing gets of its entries."""

    RUN = "bystander-reader"

    def __init__(self, sidecar: SidecarUnderTest, timeout: float, rng: random.Random) -> None:
        self.sidecar = sidecar
        self.timeout = timeout
        self.rng = rng
        self.ref = ""
        self.ids: list[str] = []
        self.client: LeanClient | None = None

    async def setup(self, entries: int, warmup: int) -> None:
        """Its scope of ``entries`` entries, its run, and ``warmup`` gets unmeasured.

        :raises RpcError: the sidecar refused the setup.
        """
        socket = self.sidecar.socket_path
        async with await LeanClient.connect(socket) as setup:
            issued = await setup.call("memory.issueRef", {"tenant": TENANT, "agent": "a"})
            self.ref = issued["memoryRef"]
            await setup.call("run.begin", {"runId": "bystander-writer", "tenant": TENANT})
            content = Content(self.rng, 300)
            for _ in range(entries):
                params = {"runId": "bystander-writer", "memoryRef": self.ref}
                entry = await setup.call("memory.put", {**params, "entry": content.next_entry()})
                self.ids.append(entry["id"])
        self.client = await LeanClient.connect(socket)
        await self.client.call("run.begin", {"runId": self.RUN, "tenant": TENANT})
        for _ in range(warmup):
            params = {"runId": self.RUN, "memoryRef": self.ref, "id": self.rng.choice(self.ids)}
            await self.client.call("memory.get", params)

    def alive(self) -> bool:
        return self.sidecar.process.memory_if_alive() is not None

    async def gets(self, stop: asyncio.Event) -> Gets:
        """Gets one after another until ``stop``; a get that takes longer than ``timeout``
        counts as that long, and the next goes on a new connection, as does one after the
        connection broke. Ends early if the sidecar exits."""
        done = Gets()
        while not stop.is_set() and self.client is not None:
            params = {"runId": self.RUN, "memoryRef": self.ref, "id": self.rng.choice(self.ids)}
            started = asyncio.get_running_loop().time()
            try:
                entry = await asyncio.wait_for(self.client.call("memory.get", params), self.timeout)
            except TimeoutError:
                done.latencies.append(self.timeout)
                done.problems["timeout"] += 1
                await self._reconnect(stop, done)
                continue
            except RpcError as exc:
                done.problems[exc.code] += 1
                await asyncio.sleep(0.001)  # not a busy loop on refusals
                continue
            except (ProtocolFailure, OSError, ValueError):
                done.problems["dropped"] += 1
                if not self.alive():
                    return done
                await self._reconnect(stop, done)
                continue
            elapsed = asyncio.get_running_loop().time() - started
            if isinstance(entry, dict) and entry.get("id") == params["id"]:
                done.latencies.append(elapsed)
            else:
                done.problems["wrong answer"] += 1
        return done

    async def _reconnect(self, stop: asyncio.Event, done: Gets) -> None:
        """A new connection, retried until ``stop`` or the sidecar's exit (then none)."""
        await self.close()
        while not stop.is_set() and self.alive():
            try:
                self.client = await asyncio.wait_for(
                    LeanClient.connect(self.sidecar.socket_path), self.timeout
                )
                return
            except OSError:  # TimeoutError included
                done.problems["reconnect failed"] += 1
                await asyncio.sleep(0.1)

    async def begin(self, run: str) -> None:
        """Another run of the bystander's tenant, left open.

        :raises RpcError: the sidecar refused it.
        """
        assert self.client is not None
        await self.client.call("run.begin", {"runId": run, "tenant": TENANT})

    async def put(self, run: str) -> str:
        """A put into its scope on its open run ``run``: ``ok``, or the error code."""
        if self.client is None:
            return "no connection"
        params = {"runId": run, "memoryRef": self.ref, "entry": {"content": "still here"}}
        try:
            await asyncio.wait_for(self.client.call("memory.put", params), self.timeout)
        except RpcError as exc:
            return exc.code
        except (ProtocolFailure, OSError, ValueError) as exc:
            return type(exc).__name__
        return "ok"

    async def close(self) -> None:
        if self.client is not None:
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(self.client.close(), 1.0)
            self.client = None
