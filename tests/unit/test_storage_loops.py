"""The orchestration written once above the backends (storage/batches.py, migrations.py,
catch_up.py), driven by plain callables: the order, the stopping rules and what a failure
means. Each backend's own batches are checked against its database by the contract suite."""

from __future__ import annotations

import pytest
from openwop_memory.storage.base import StorageStartupError
from openwop_memory.storage.batches import SWEEP_STEPS, SweepBatch, sweep_steps, until_short
from openwop_memory.storage.catch_up import CatchUp
from openwop_memory.storage.migrations import migrations_to_run
from openwop_memory_client import UpstreamUnavailableError

pytestmark = [pytest.mark.backend_independent, pytest.mark.anyio]


def counting(sizes: list[int | None], log: list[str], name: str) -> SweepBatch:
    """A step whose batches remove ``sizes`` rows one after the other."""

    async def batch() -> int | None:
        log.append(name)
        return sizes.pop(0)

    return batch


async def test_a_sweep_runs_its_steps_in_order_each_until_a_short_batch() -> None:
    log: list[str] = []
    sizes: dict[str, list[int | None]] = {
        name: [3, 3, 1] if name == "expired_entries" else [0] for name in SWEEP_STEPS
    }
    batches = {name: counting(sizes[name], log, name) for name in SWEEP_STEPS}
    counts = await sweep_steps(batches, batch_size=3)
    assert log == ["expired_entries"] * 3 + list(SWEEP_STEPS[1:])
    assert counts.expired_entries == 7 and counts.errors == []
    # Runs lose their snapshots before tombstones are weighed: one pass removes both.
    assert SWEEP_STEPS.index("expired_runs") < SWEEP_STEPS.index("purged_tombstones")


async def test_a_failed_step_is_noted_and_the_next_runs_and_another_sweeper_ends_the_pass() -> None:
    log: list[str] = []

    async def failing() -> int | None:
        log.append("purged_changes")
        raise UpstreamUnavailableError("down", {"reason": "connection_lost"})

    batches = {name: counting([0], log, name) for name in SWEEP_STEPS}
    batches["purged_changes"] = failing
    batches["expired_runs"] = counting([None], log, "expired_runs")
    counts = await sweep_steps(batches, batch_size=10)
    assert counts.errors == ["purged_changes: connection_lost"]
    assert log == list(SWEEP_STEPS[: SWEEP_STEPS.index("expired_runs") + 1])


async def test_until_short_sums_what_was_removed_and_stops_on_what_was_found() -> None:
    rounds = [(5, 5), (5, 3), (2, 2)]  # another process took two rows of the second batch

    async def batch() -> tuple[int, int]:
        return rounds.pop(0)

    assert await until_short(batch, batch_size=5) == 10 and rounds == []


def test_migrations_after_the_database_s_version_run_in_order() -> None:
    migrations = [(1, ["a"]), (2, ["b"]), (4, ["c", "d"])]
    assert migrations_to_run(0, migrations) == migrations
    assert migrations_to_run(2, migrations) == [(4, ["c", "d"])]
    assert migrations_to_run(4, migrations) == []
    with pytest.raises(StorageStartupError, match="version 5, newer than this sidecar knows"):
        migrations_to_run(5, migrations)


async def test_a_catch_up_works_until_a_short_batch_and_only_when_enabled() -> None:
    sizes = [4, 4, 1]

    async def batch() -> int:
        return sizes.pop(0)

    catch_up = CatchUp(batch, 4, "work_failed")
    await catch_up.everything()
    assert sizes == []
    catch_up.enabled = False
    catch_up.note_put()  # nothing scheduled: a batch would find the list empty and fail
    await catch_up.close()
