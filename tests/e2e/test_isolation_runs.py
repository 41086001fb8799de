"""Open runs are bounded per tenant, abandoned ones give their memory back, and run ids are
per tenant.

Reproduction (issue 20, rows 5 and 7b): tenant B beginning 10,001 runs evicted tenant A's
open runs (one least-recently-used list over every tenant, for ``max_open_runs`` and for the
keyring budget alike), so A's puts answered ``not_found``; and a run begun and never ended
held its handle and keyring until one of those limits pushed it out (a soak with abandoned
runs grew ~14 MiB/min). Row 9: tenant B taking tenant A's predictable run id first made
A's ``run.begin`` ``forbidden`` for the whole retention, and told B the id was in use.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from openwop_memory.redaction import estimate_bytes
from openwop_memory.service.keyring_memory import KeyringBudget
from openwop_memory.service.runs import RunHandle, RunRegistry
from openwop_memory.storage.base import BeginOutcome, Snapshot
from openwop_memory.timefmt import now_us
from openwop_memory_client import AsyncMemoryClient, RateLimitedError
from support.backends import Backend
from support.old_schema import make_v1_database
from support.polling import eventually
from support.protocol import assert_run_not_found, pipeline, put, req
from support.sidecar import RawClient, Sidecar

_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def secret_value(seed: int, chars: int = 100) -> str:
    return "".join(_ALPHABET[(seed * 31 + i * 7 + i * i) % 62] for i in range(chars))


def secrets_of(seed: int, count: int = 2) -> list[dict[str, str]]:
    return [{"id": f"k{seed}x{i}", "value": secret_value(seed * 100 + i)} for i in range(count)]


def begin_many(
    client: RawClient,
    tenant: str,
    prefix: str,
    count: int,
    *,
    with_secrets: bool = True,
    window: int = 100,
) -> list[Any]:
    """``count`` runs of ``tenant`` begun, pipelined ``window`` at a time; their answers,
    in the order of the runs (answers may come out of order: sorted by id)."""
    answers: list[Any] = []
    for start in range(0, count, window):
        lines = [
            req(
                "run.begin",
                {
                    "runId": f"{prefix}{n}",
                    "tenant": tenant,
                    **({"secrets": secrets_of(n)} if with_secrets else {}),
                },
                rid=n,
            )
            for n in range(start, min(count, start + window))
        ]
        answers += sorted(pipeline(client, lines), key=lambda answer: answer["id"])
    return answers


# -- row 5: a flood of one tenant's runs evicts only that tenant's --------------------------


def test_a_tenant_flooding_runs_evicts_its_own_never_a_tenant_within_its_share(
    workdir: Path,
) -> None:
    """Room for 40 open runs: A holds 5, B begins 600. A's five still take puts, redacted
    with their secrets, and only B's runs were evicted (B keeps its newest)."""
    mine = {n: secrets_of(1000 + n) for n in range(5)}
    with Sidecar(workdir, "--max-open-runs", "40") as s, s.client() as c:
        for n, secrets in mine.items():
            c.call("run.begin", runId=f"a{n}", tenant="acme", secrets=secrets)
        answers = begin_many(c, "bully", "b", 599, with_secrets=False)
        # The last one alone: pipelined begins may finish in any order, so only a run begun
        # after all the others is surely B's newest.
        answers.append({"result": c.call("run.begin", runId="b599", tenant="bully")})
        assert all("result" in a for a in answers), answers[:3]  # B is never refused
        stats = c.call("sidecar.stats")
        assert stats["activeRuns"] == 40 and stats["runsEvicted"] == 565
        for n, secrets in mine.items():
            entry = put(c, f"a{n}", "notes", f"token {secrets[0]['value']} end")
            assert entry["content"] == f"token [REDACTED:{secrets[0]['id']}] end"
        put(c, "b599", "notes", "the newest of B's runs is open")
        assert_run_not_found(
            c.error("memory.put", runId="b0", memoryRef="notes", entry={"content": "x"})
        )


def test_the_keyring_budget_takes_room_from_the_tenant_holding_most(workdir: Path) -> None:
    """Keyring memory for ~8 runs: A's 2 runs with secrets stay compiled and open while B
    begins 100 runs with secrets, 4 at a time: each evicts one of B's own."""
    cap = estimate_bytes({s["value"]: s["id"] for s in secrets_of(0)}) * 8
    with Sidecar(workdir, "--max-keyring-memory-bytes", str(cap)) as s, s.client() as c:
        mine = {n: secrets_of(2000 + n) for n in range(2)}
        for n, secrets in mine.items():
            c.call("run.begin", runId=f"a{n}", tenant="acme", secrets=secrets)
        answers = begin_many(c, "bully", "b", 100, window=4)
        assert all("result" in a for a in answers), [a for a in answers if "error" in a][:2]
        stats = c.call("sidecar.stats")
        assert stats["runsEvicted"] >= 100 - 6 and stats["keyringMemoryBytes"] <= cap
        for n, secrets in mine.items():
            entry = put(c, f"a{n}", "notes", f"pw {secrets[1]['value']}")
            assert entry["content"] == f"pw [REDACTED:{secrets[1]['id']}]"


class Holder:
    def __init__(self, budget: KeyringBudget, key: str, nbytes: int, party: str) -> None:
        self.busy = False
        self.evicted = False
        budget.charge(key, nbytes, self.evict, party)

    def evict(self) -> bool:
        if self.busy:
            return False
        self.evicted = True
        return True


def test_the_budget_refuses_rather_than_evict_a_tenant_within_its_share() -> None:
    """A holds 400 of 1,000 (its share is 500), B 500 in use: B asking for 200 more is
    rate_limited and A keeps its keyring; once B's is idle, B's own goes instead."""
    budget = KeyringBudget(1000)
    a = Holder(budget, "a", 400, "A")
    b = Holder(budget, "b", 500, "B")
    b.busy = True
    with pytest.raises(RateLimitedError), budget.reserve(200, "B"):
        pass
    assert not a.evicted and budget.held == 900
    b.busy = False
    with budget.reserve(200, "B"):
        assert b.evicted and not a.evicted and budget.held == 600
    # A newcomer's room comes from the party over its share.
    fresh = KeyringBudget(1000)
    big = Holder(fresh, "big", 800, "A")
    with fresh.reserve(400, "C"):
        assert big.evicted and fresh.held == 400


# -- row 7b: an abandoned run gives its memory back ---------------------------------------


def test_abandoned_runs_are_dropped_after_the_idle_bound_and_resume_on_their_snapshot(
    workdir: Path,
) -> None:
    with Sidecar(workdir, "--run-idle-timeout", "1s") as s, s.client() as c:
        answers = begin_many(c, "acme", "gone", 50)
        snapshot = answers[7]["result"]["snapshotAt"]
        c.call("run.begin", runId="kept", tenant="acme")
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:  # a run in use is never idle
            put(c, "kept", "notes", "still working")
            time.sleep(0.2)
        stats = c.call("sidecar.stats")
        assert stats["activeRuns"] == 1 and stats["runsIdleDropped"] == 50
        assert stats["keyringMemoryBytes"] == 0
        assert_run_not_found(
            c.error("memory.put", runId="gone7", memoryRef="notes", entry={"content": "x"})
        )
        again = c.call("run.begin", runId="gone7", tenant="acme", secrets=secrets_of(7))
        assert again["resumed"] is True and again["snapshotAt"] == snapshot
        secret = secrets_of(7)[0]
        assert put(c, "gone7", "notes", secret["value"])["content"] == f"[REDACTED:{secret['id']}]"
        # With nobody asking, the count still falls to zero once the bound has passed.
        eventually(lambda: c.call("sidecar.stats")["activeRuns"] == 0 or None, timeout=10)


def test_abandoned_runs_give_their_keyrings_back_round_after_round(workdir: Path) -> None:
    """Two rounds of 200 runs with two secrets each, begun and abandoned: each round holds
    its keyrings (over 3 MiB) until the idle bound drops the runs, then none. What the RSS
    does over many rounds is measured by ``make soak`` (a verdict on growth after warm-up),
    not here: beside the rest of the suite the allocator's heap moved by up to 8 MiB a round
    whatever the runs held, which no gating bound can tell from a leak of one round."""
    with Sidecar(workdir, "--run-idle-timeout", "1s") as s, s.client() as c:
        for round_ in range(2):
            answers = begin_many(c, "acme", f"r{round_}-", 200)
            assert all("result" in a for a in answers)
            # Runs idle for 1 s may go before this under load: most are still held.
            assert c.call("sidecar.stats")["keyringMemoryBytes"] > 3 << 20
            eventually(lambda: c.call("sidecar.stats")["activeRuns"] == 0 or None, timeout=15)
            stats = c.call("sidecar.stats")
            assert stats["keyringMemoryBytes"] == 0
            assert stats["runsIdleDropped"] >= 200 * (round_ + 1)
        assert s.proc is not None and s.proc.poll() is None


@pytest.mark.anyio
async def test_the_client_begins_a_run_dropped_for_idleness_again(workdir: Path) -> None:
    secret = secret_value(5)
    with Sidecar(workdir, "--run-idle-timeout", "1s") as s:
        async with (
            AsyncMemoryClient(s.socket) as client,
            client.run("slow", "acme", secrets={"key": secret}) as run,
        ):
            first = await run.put("notes", {"content": "before the pause"})
            await anyio.sleep(2.5)  # the worker thinks for longer than the bound
            second = await run.put("notes", {"content": f"after {secret}"})
            assert second.content == "after [REDACTED:key]"
            assert run.resumed is False and first.id != second.id
        with s.client() as c:
            assert c.call("sidecar.stats")["runsIdleDropped"] >= 1


# -- row 9: run ids are per tenant ---------------------------------------------------------


def test_a_run_id_taken_by_another_tenant_first_neither_blocks_nor_tells(workdir: Path) -> None:
    """B begins A's predictable run id first: A's begin answers exactly as for a fresh id
    (resumed false, its own snapshot), A's calls with its issued ref reach A's run, and a
    plain ref that cannot tell the two runs apart is a conflict on ``runId``, never
    another tenant's memory."""
    with Sidecar(workdir) as s, s.client() as c:
        a_ref = c.call("memory.issueRef", tenant="acme", agent="w")["memoryRef"]
        b_ref = c.call("memory.issueRef", tenant="bully", agent="w")["memoryRef"]
        c.call("run.begin", runId="writer", tenant="acme")
        mine = put(c, "writer", a_ref, "acme's note")
        squat = c.call("run.begin", runId="run-42", tenant="bully")
        put(c, "run-42", b_ref, "planted by bully")
        fresh = c.call("run.begin", runId="run-43", tenant="acme")
        begun = c.call("run.begin", runId="run-42", tenant="acme")
        assert begun["resumed"] is fresh["resumed"] is False
        assert begun.keys() == fresh.keys() and begun["tenant"] == "acme"
        assert begun["snapshotAt"] > squat["snapshotAt"]
        listed = c.call("memory.list", runId="run-42", memoryRef=a_ref)
        assert [e["content"] for e in listed] == [mine["content"]]
        assert put(c, "run-42", a_ref, "acme writes")["content"] == "acme writes"
        err = c.error("memory.list", runId="run-42", memoryRef="notes")
        assert err.code == "conflict" and err.details == {"field": "runId"}
        assert "bully" not in str(err.error) and "acme" not in str(err.error)
        # Each tenant's issued ref still reaches its own run only.
        theirs = c.call("memory.list", runId="run-42", memoryRef=b_ref)
        assert theirs == []  # B's snapshot was taken before B's own put
        c.call("run.end", runId="writer")


@pytest.mark.anyio
@pytest.mark.backend_independent  # it runs on each backend already
@pytest.mark.migrates
async def test_a_database_with_runs_of_the_old_schema_migrates(
    backend: Backend, tmp_path: Path
) -> None:
    """A run stored under the old schema (keyed by id alone) is still its tenant's after
    the migration: resumed on its snapshot; another tenant's begin of its id is a new run."""
    path = tmp_path / "old.db"
    await _make_v1_database_with_a_run(backend, path)
    store = backend.storage(path)
    await store.open()
    try:
        old = await store.begin_run(
            run_id="old-run", tenant="acme", replay=True, now_us=now_us(), retention_cutoff_us=0
        )
        assert old.outcome is BeginOutcome.RESUMED and old.run is not None
        assert old.run.snapshot_us == 5
        other = await store.begin_run(
            run_id="old-run", tenant="bully", replay=False, now_us=now_us(), retention_cutoff_us=0
        )
        assert other.outcome is BeginOutcome.CREATED
        found = await store.find_runs(run_id="old-run", retention_cutoff_us=0)
        assert [r.tenant for r in found] == ["acme", "bully"]
    finally:
        await store.close()


async def _make_v1_database_with_a_run(backend: Backend, path: Path) -> None:
    """A database as a version-1 sidecar left it, holding run ``old-run`` of ``acme``."""
    run = ("old-run", "acme", 0, 5, now_us())
    await make_v1_database(
        backend,
        path,
        sqlite=[("INSERT INTO runs VALUES (?, ?, ?, ?, ?)", run)],
        postgresql=[("INSERT INTO runs VALUES ($1, $2, $3, $4, $5)", run)],
    )


def test_the_registry_evicts_only_from_a_tenant_over_its_share() -> None:
    """Random begins and ends of five tenants against room for 12: every eviction takes
    the least recently used run of a tenant holding more than its share (12 over the
    tenants with open runs, counting the one beginning), and the counts stay exact."""
    rng = random.Random(20)
    registry = RunRegistry(12, KeyringBudget(1 << 20))
    for step in range(3000):
        tenant = f"t{min(rng.randrange(8), 4)}"  # t4 begins far more often than the rest
        if rng.random() < 0.2 and len(registry):
            registry.end(rng.choice(registry.keys()))
            continue
        before = registry.keys()
        registry.add(RunHandle(f"r{step}", tenant, Snapshot(0), 0, {}))
        gone = set(before) - set(registry.keys())
        assert len(gone) == (len(before) == 12)
        for key in gone:
            held = Counter(k.tenant for k in before) + Counter([tenant])
            share = 12 / len(held)
            assert held[key.tenant] > share, (step, key, held)
            oldest = next(k for k in before if k.tenant == key.tenant)
            assert key == oldest
    assert registry.evicted > 100
    assert len(registry) == len(registry.keys()) <= 12
