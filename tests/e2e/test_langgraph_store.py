"""The LangGraph store (``openwop_memory_client.langgraph_store``) against a real sidecar:
LangGraph's own calls (``put``/``get``/``search``/``delete``/``list_namespaces`` and
``abatch``) on namespaces mapped to scopes and keys to keyed entries. Where the store means
to behave as LangGraph's own ``InMemoryStore``, the same ops run on both and the observable
results are compared."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, TypedDict

import anyio
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import (
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchOp,
    TTLConfig,
)
from langgraph.store.memory import InMemoryStore
from openwop_memory_client import AsyncMemoryRun, MemoryClient, MemoryValidationError, Revision
from openwop_memory_client import _langgraph_runs as lg_runs
from openwop_memory_client import langgraph_store as lg
from openwop_memory_client._langgraph_runs import current_run_id
from openwop_memory_client.langgraph_store import OpenWopStore
from support.examples import python_block, run_example, says_it_prints
from support.sidecar import Sidecar

ROOT = Path(__file__).resolve().parents[2]

SECRET = "sk-lg-7c2e91ab44f0d3"


def store(
    sidecar: Sidecar, tenant: str | None = None, ttl: TTLConfig | None = None
) -> OpenWopStore:
    # A tenant of its own per test: the module's sidecar is shared.
    s = OpenWopStore(
        str(sidecar.socket),
        tenant=tenant or f"lg-{uuid.uuid4().hex[:8]}",
        secrets={"lgkey": SECRET},
    )
    s.ttl_config = ttl  # what the ``ttl`` argument sets
    return s


def history(s: OpenWopStore, namespace: tuple[str, ...], key: str) -> list[Revision]:
    """The key's stored revisions, newest first, read by a client of its own."""
    with MemoryClient(s._socket) as raw:
        ref = raw.issue_ref(s._tenant, "langgraph", lg._encode(namespace))
        with raw.run(f"lg-raw-{uuid.uuid4()}", s._tenant) as run:
            return run.history(ref, key)


def observed(result: Result | tuple[str, ...]) -> Any:
    """What a caller observes of a result, comparable across stores (not times or scores)."""
    if isinstance(result, Item):
        return (result.namespace, result.key, result.value)
    if isinstance(result, list):
        parts = [observed(one) for one in result]
        # Searches' orders differ by design (by time here); namespaces' are sorted in both.
        return sorted(parts) if result and isinstance(result[0], Item) else parts
    return result


def test_values_round_trip_and_an_update_keeps_the_creation_time(shared_sidecar: Sidecar) -> None:
    s = store(shared_sidecar)
    value = {"text": "tea at four", "n": 3, "nested": {"ok": True, "list": [1, "two"]}}
    s.put(("users", "u1"), "prefs", value)
    first = s.get(("users", "u1"), "prefs")
    assert first is not None and first.value == value and first.key == "prefs"
    assert first.namespace == ("users", "u1")
    s.put(("users", "u1"), "prefs", {"text": "coffee"})
    second = s.get(("users", "u1"), "prefs")
    assert second is not None and second.value == {"text": "coffee"}
    assert second.created_at == first.created_at and second.updated_at > first.updated_at
    assert s.get(("users", "u1"), "absent") is None
    assert s.get(("users", "u2"), "prefs") is None  # another namespace is another scope
    s.delete(("users", "u1"), "prefs")
    assert s.get(("users", "u1"), "prefs") is None


def test_search_filters_pages_and_ranks_and_namespaces_are_listed(shared_sidecar: Sidecar) -> None:
    s = store(shared_sidecar)
    for i in range(5):
        s.put(("docs", "a"), f"k{i}", {"text": f"note number {i} about tea", "i": i})
    s.put(("docs", "b"), "other", {"text": "a note about coffee", "i": 9})
    s.put(("misc",), "x", {"text": "unrelated"})
    everything = s.search(("docs",), limit=100)
    assert sorted(item.key for item in everything) == ["k0", "k1", "k2", "k3", "k4", "other"]
    assert [i.key for i in s.search(("docs",), filter={"i": {"$gte": 3}}, limit=100)] == [
        item.key for item in everything if item.value["i"] >= 3
    ]
    assert len(s.search(("docs",), limit=2, offset=1)) == 2
    hits = s.search(("docs",), query="coffee")
    assert hits[0].key == "other" and hits[0].score is not None
    assert s.list_namespaces() == [("docs", "a"), ("docs", "b"), ("misc",)]
    assert s.list_namespaces(prefix=("docs",)) == [("docs", "a"), ("docs", "b")]
    assert s.list_namespaces(max_depth=1) == [("docs",), ("misc",)]
    # An entry another client wrote in a namespace's scope is not an item: searches skip it.
    with MemoryClient(shared_sidecar.socket) as raw:
        ref = raw.issue_ref(s._tenant, "langgraph", '["docs","a"]')
        with raw.run(f"lg-raw-{uuid.uuid4()}", s._tenant) as run:
            run.put(ref, "plain text about tea, not JSON")
    assert len(s.search(("docs", "a"), query="tea", limit=100)) == 5


def test_a_batch_reads_before_its_puts_and_the_next_call_sees_them(shared_sidecar: Sidecar) -> None:
    s = store(shared_sidecar)

    async def batches() -> tuple[list[Result], list[Result]]:
        first = await s.abatch([PutOp(("ns",), "k", {"v": f"holds {SECRET}"}), GetOp(("ns",), "k")])
        second = await s.abatch([GetOp(("ns",), "k")])
        return first, second

    first, second = anyio.run(batches)
    assert first == [None, None]  # the batch's own put is after its snapshot
    (item,) = second
    assert isinstance(item, Item)
    assert item.value == {"v": "holds [REDACTED:lgkey]"}


@pytest.mark.parametrize("bad", [{"v": object()}])
def test_a_value_that_is_not_json_is_refused_before_anything_is_sent(
    shared_sidecar: Sidecar, bad: dict[str, object]
) -> None:
    s = store(shared_sidecar)
    with pytest.raises(TypeError):
        s.put(("ns",), "k", bad)
    with pytest.raises(TypeError):  # nor is the batch's good put written before it
        s.batch([PutOp(("ns",), "good", {"v": 1}), PutOp(("ns",), "k", bad)])
    assert s.list_namespaces() == [] and s.get(("ns",), "good") is None


def test_the_docs_graph_runs_and_prints_what_it_says(
    shared_sidecar: Sidecar, tmp_path: Path
) -> None:

    code = python_block(ROOT / "docs" / "langgraph.md", after="## A small graph using the store")
    printed = run_example(code, shared_sidecar.socket, tmp_path)
    assert printed == ["recalled: ['the key is [REDACTED:api]']", "namespaces: [('notes', 'ada')]"]
    says_it_prints(code, printed, "docs/langgraph.md")


# -- 1. one batch, one snapshot; the last write per key wins ---------------------------------

NS = ("users", "u1")
SEQUENCES: dict[str, list[list[Op]]] = {
    "a put then a delete ends deleted": [
        [PutOp(NS, "k", {"v": 1})],
        [PutOp(NS, "k", {"v": 2}), PutOp(NS, "k", None)],
        [GetOp(NS, "k"), SearchOp(("users",))],
    ],
    "a put then a delete of a new key ends deleted": [
        [PutOp(NS, "k", {"v": 1}), PutOp(NS, "k", None)],
        [GetOp(NS, "k")],
    ],
    "a delete then a put ends present": [
        [PutOp(NS, "k", {"v": 1})],
        [PutOp(NS, "k", None), PutOp(NS, "k", {"v": 3})],
        [GetOp(NS, "k")],
    ],
    "reads do not see the batch's own puts": [
        [PutOp(NS, "k", {"v": 1}), GetOp(NS, "k"), SearchOp(("users",))],
        [PutOp(NS, "k", {"v": 2}), GetOp(NS, "k"), SearchOp(("users",))],
        [GetOp(NS, "k")],
    ],
    "namespaces and filters": [
        [
            PutOp(("a", "x"), "k", {"n": 1, "tag": {"colour": "red"}}),
            PutOp(("a", "y", "z"), "k", {"n": 2, "tag": {"colour": "blue"}}),
            PutOp(("b", "x"), "k", {"n": 3}),
        ],
        [
            ListNamespacesOp(),
            ListNamespacesOp((MatchCondition("prefix", ("a",)),)),
            ListNamespacesOp((MatchCondition("suffix", ("x",)),)),
            ListNamespacesOp((MatchCondition("prefix", ("*", "x")),)),
            ListNamespacesOp(max_depth=1),
            ListNamespacesOp(limit=1, offset=1),
            SearchOp(("a",), filter={"n": {"$gte": 2}}),
            SearchOp((), filter={"n": {"$ne": 2}}),
            SearchOp((), filter={"tag": {"colour": "red"}}),
            SearchOp((), filter={"n": 3, "absent": None}),
        ],
    ],
    "the last of two puts wins": [
        [PutOp(NS, "k", {"v": 1}), PutOp(NS, "j", {"v": 0}), PutOp(NS, "k", {"v": 2})],
        [GetOp(NS, "k"), GetOp(NS, "j"), SearchOp(("users",))],
    ],
}


@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_a_batch_behaves_as_the_in_memory_store(shared_sidecar: Sidecar, name: str) -> None:
    ours, theirs = store(shared_sidecar), InMemoryStore()
    for ops in SEQUENCES[name]:
        expected = [observed(result) for result in theirs.batch(ops)]
        assert [observed(result) for result in ours.batch(ops)] == expected, ops


# -- 1b. one snapshot per LangGraph run, with the run's own writes over it -------------------


class GraphState(TypedDict, total=False):
    seen: list[Any]


def in_graph_run(run_id: str | None, body: Callable[[], list[Any]]) -> list[Any]:
    """``body()`` called in a node of a one-node graph invoked with ``run_id`` as its
    ``configurable.run_id`` (none: a graph run without one); what it returned."""

    def node(state: GraphState) -> GraphState:
        return {"seen": body()}

    builder = StateGraph(GraphState)
    builder.add_node("node", node)
    builder.add_edge(START, "node")
    builder.add_edge("node", END)
    config: RunnableConfig = {"configurable": {} if run_id is None else {"run_id": run_id}}
    return list(builder.compile().invoke({}, config)["seen"])


@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_the_calls_of_a_graph_run_behave_as_the_in_memory_store(
    shared_sidecar: Sidecar, name: str
) -> None:
    """Within one LangGraph run, every call reads the run's snapshot with the run's own
    earlier writes over it: with no other writer, what LangGraph's store shows."""
    ours, theirs = store(shared_sidecar), InMemoryStore()
    expected = [[observed(result) for result in theirs.batch(ops)] for ops in SEQUENCES[name]]

    def calls() -> list[Any]:
        return [[observed(result) for result in ours.batch(ops)] for ops in SEQUENCES[name]]

    assert in_graph_run(f"run-{uuid.uuid4()}", calls) == expected


def test_a_graph_run_reads_its_snapshot_and_its_own_writes_not_others(
    shared_sidecar: Sidecar,
) -> None:
    s = store(shared_sidecar)
    other = OpenWopStore(str(shared_sidecar.socket), tenant=s._tenant, snapshots="call")
    s.put(("notes",), "shared", {"v": 0})

    def body() -> list[Any]:
        first = s.get(("notes",), "shared")  # the run's snapshot is taken here
        s.put(("notes",), "mine", {"v": 1})
        s.put(("mine",), "k", {"v": 2})
        s.delete(("notes",), "shared")
        other.put(("notes",), "theirs", {"v": 3})  # another writer, after the snapshot
        other.put(("theirs",), "k", {"v": 4})
        return [
            observed(first),
            observed(s.get(("notes",), "shared")),  # deleted by the run
            observed(s.get(("notes",), "mine")),
            observed(s.get(("notes",), "theirs")),  # after the snapshot: not seen
            observed(s.search(("notes",))),
            s.list_namespaces(),
        ]

    seen = in_graph_run(f"run-{uuid.uuid4()}", body)
    assert seen == [
        (("notes",), "shared", {"v": 0}),
        None,
        (("notes",), "mine", {"v": 1}),
        None,
        [(("notes",), "mine", {"v": 1})],
        [("mine",), ("notes",)],
    ]
    # Outside the run, every write is there.
    assert sorted(item.key for item in s.search(("notes",))) == ["mine", "theirs"]


def test_a_replayed_graph_run_reads_what_its_first_execution_read(
    shared_sidecar: Sidecar,
) -> None:
    """The same ``run_id`` again, from a new store (another process, after a restart):
    the original snapshot, not the writes made since, the run's own first execution's
    included. A new ``run_id`` reads the store as it is now."""
    first = store(shared_sidecar)
    first.put(("counter",), "n", {"v": 0})
    run_id = f"run-{uuid.uuid4()}"

    def increment(s: OpenWopStore) -> Callable[[], list[Any]]:
        def body() -> list[Any]:
            item = s.get(("counter",), "n")
            assert item is not None
            s.put(("counter",), "n", {"v": item.value["v"] + 1})
            return [item.value["v"]]

        return body

    assert in_graph_run(run_id, increment(first)) == [0]
    OpenWopStore(str(shared_sidecar.socket), tenant=first._tenant).put(("counter",), "n", {"v": 5})
    again = OpenWopStore(str(shared_sidecar.socket), tenant=first._tenant)
    assert in_graph_run(run_id, increment(again)) == [0]  # the replay wrote 1 again
    assert in_graph_run(f"run-{uuid.uuid4()}", increment(again)) == [1]


@pytest.mark.parametrize(("with_run_id", "snapshots"), [(False, "run"), (True, "call")])
def test_without_a_run_id_or_with_snapshots_call_each_call_reads_anew(
    shared_sidecar: Sidecar, with_run_id: bool, snapshots: Literal["run", "call"]
) -> None:
    s = OpenWopStore(
        str(shared_sidecar.socket), tenant=f"lg-{uuid.uuid4().hex[:8]}", snapshots=snapshots
    )
    other = OpenWopStore(str(shared_sidecar.socket), tenant=s._tenant, snapshots="call")

    def body() -> list[Any]:
        before = s.get(("ns",), "k")
        other.put(("ns",), "k", {"v": 1})
        return [observed(before), observed(s.get(("ns",), "k"))]

    run_id = f"run-{uuid.uuid4()}" if with_run_id else None
    assert in_graph_run(run_id, body) == [None, (("ns",), "k", {"v": 1})]


def test_the_run_id_and_the_runs_remembered_are_as_the_docs_say() -> None:
    page = (ROOT / "docs" / "langgraph.md").read_text()
    assert f"last {lg_runs.RUNS_KEPT:,} runs" in page
    assert current_run_id() is None  # outside a graph run
    assert in_graph_run("r-1", lambda: [current_run_id()]) == ["langgraph-run-r-1"]
    odd = "x" * 201
    digest = hashlib.sha256(odd.encode()).hexdigest()
    assert in_graph_run(odd, lambda: [current_run_id()]) == [f"langgraph-run-{digest}"]
    writes = lg_runs.RunWrites(kept=2)
    writes.of("a")[(("ns",), "k")] = None
    writes.of("b")[(("ns",), "k")] = None
    writes.of("a")  # used again: "b" is now the oldest
    writes.of("c")
    assert writes.of("a") == {(("ns",), "k"): None}
    assert writes.of("b") == {}  # forgotten


def test_snapshots_takes_run_or_call(shared_sidecar: Sidecar) -> None:
    with pytest.raises(ValueError, match="snapshots"):
        OpenWopStore(str(shared_sidecar.socket), tenant="t", snapshots="never")  # type: ignore[arg-type]


# -- 1c. one connection per store, its refs issued once -------------------------------------


def test_a_store_keeps_one_connection_for_all_its_calls(shared_sidecar: Sidecar) -> None:
    """Sync calls, and async ones from loops of their own, all go over the store's one
    connection (the sidecar accepts one), and work again after ``close``."""
    s = store(shared_sidecar)
    with shared_sidecar.client() as stats:
        before = stats.call("sidecar.stats")["connections"]["accepted"]
        for n in range(5):
            s.put(("ns",), f"k{n}", {"v": n})
            anyio.run(s.aget, ("ns",), f"k{n}")
        assert len(s.search(("ns",))) == 5
        assert stats.call("sidecar.stats")["connections"]["accepted"] == before + 1
        s.close()
        item = s.get(("ns",), "k0")
        assert item is not None and item.value == {"v": 0}
        assert stats.call("sidecar.stats")["connections"]["accepted"] == before + 2
    s.close()


def test_a_store_issues_its_refs_again_after_reconnecting(tmp_path: Path) -> None:
    """Another sidecar, on another database, takes over the socket: the store's next call
    reconnects and issues its refs there (the old ones would resolve to nothing)."""
    socket_path = tmp_path / "s.sock"
    first = Sidecar(tmp_path, socket_path=socket_path, database=tmp_path / "one.db")
    with first:
        s = OpenWopStore(str(socket_path), tenant="lg-moved")
        s.put(("ns",), "k", {"v": "first"})
    second = Sidecar(tmp_path, socket_path=socket_path, database=tmp_path / "two.db")
    with second:
        OpenWopStore(str(socket_path), tenant="lg-moved", snapshots="call").put(
            ("ns",), "k", {"v": "second"}
        )
        item = s.get(("ns",), "k")
        assert item is not None and item.value == {"v": "second"}
    s.close()


def test_a_sync_call_from_the_store_s_own_loop_is_refused(shared_sidecar: Sidecar) -> None:
    s = store(shared_sidecar)

    async def inside(client: Any) -> None:
        with pytest.raises(RuntimeError, match="own loop"):
            s.batch([GetOp(("ns",), "k")])

    s._channel.run(inside)
    s.close()


# -- 2. puts compare-and-set on the key's revision --------------------------------------------


def before_first(
    monkeypatch: pytest.MonkeyPatch, method: str, meanwhile: Callable[[], Awaitable[None]]
) -> None:
    """Run ``meanwhile`` (another writer) just before the first call of ``AsyncMemoryRun``'s
    ``method``: a race, made to happen every time."""
    real = getattr(AsyncMemoryRun, method)
    raced: list[bool] = []

    async def racing(self: AsyncMemoryRun, *args: Any, **kwargs: Any) -> Any:
        if not raced:
            raced.append(True)
            await meanwhile()
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(AsyncMemoryRun, method, racing)


def test_a_put_racing_another_writer_keeps_both_revisions_and_the_creation(
    shared_sidecar: Sidecar, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = store(shared_sidecar)
    other = store(shared_sidecar, tenant=s._tenant)

    async def theirs() -> None:
        await other.abatch([PutOp(("ns",), "k", {"v": "theirs"})])

    before_first(monkeypatch, "put_keyed", theirs)
    s.put(("ns",), "k", {"v": "ours"})
    monkeypatch.undo()
    item = s.get(("ns",), "k", refresh_ttl=False)
    revisions = history(s, ("ns",), "k")
    assert item is not None and item.value == {"v": "ours"}
    assert [r.state for r in revisions] == ["current", "superseded"]
    assert '"theirs"' in revisions[1].entry.content
    # Ours was written knowing theirs: the item's creation is the key's first revision's.
    assert item.created_at == revisions[1].entry.created_at


def test_a_put_losing_every_compare_and_set_is_written_last(
    shared_sidecar: Sidecar, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = store(shared_sidecar)
    other = store(shared_sidecar, tenant=s._tenant)
    real = AsyncMemoryRun.put_keyed
    tries: list[int | None] = []  # the expected revision of each of our puts of the key
    theirs: list[bool] = []  # set while the other writer writes

    async def always_raced(
        self: AsyncMemoryRun, scope: str, key: str, content: str, **kwargs: Any
    ) -> Any:
        expected = kwargs.get("expected_revision")
        if key == "k" and not theirs:
            tries.append(expected)
            if expected is not None:  # another writer gets there first, every time
                theirs.append(True)
                try:
                    await other.abatch([PutOp(("ns",), "k", {"v": f"theirs {len(tries)}"})])
                finally:
                    theirs.clear()
        return await real(self, scope, key, content, **kwargs)

    monkeypatch.setattr(AsyncMemoryRun, "put_keyed", always_raced)
    s.put(("ns",), "k", {"v": "ours"})
    monkeypatch.undo()
    # 8 compare-and-sets, each expecting the revision the previous lost to, then one
    # unconditional put.
    assert tries == [0, 1, 2, 3, 4, 5, 6, 7, None]
    item = s.get(("ns",), "k")
    assert item is not None and item.value == {"v": "ours"}  # the last writer wins
    revisions = history(s, ("ns",), "k")
    assert len(revisions) == 9 and [r.state for r in revisions].count("current") == 1
    assert item.created_at == revisions[-1].entry.created_at


def test_a_delete_racing_a_put_deletes_the_newer_revision(
    shared_sidecar: Sidecar, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = store(shared_sidecar)
    other = store(shared_sidecar, tenant=s._tenant)
    s.put(("ns",), "k", {"v": 1})

    async def theirs() -> None:
        await other.abatch([PutOp(("ns",), "k", {"v": 2})])

    before_first(monkeypatch, "delete", theirs)
    s.delete(("ns",), "k")
    monkeypatch.undo()
    assert s.get(("ns",), "k") is None  # the delete came last: it wins
    assert [r.state for r in history(s, ("ns",), "k")] == ["deleted", "superseded"]


def test_concurrent_writers_each_write_one_revision_and_keep_the_creation(
    shared_sidecar: Sidecar,
) -> None:
    writers = [store(shared_sidecar)]
    writers.append(store(shared_sidecar, tenant=writers[0]._tenant))

    async def write(s: OpenWopStore, who: int) -> None:
        for i in range(6):
            await s.aput(("ns",), "k", {"who": who, "i": i})

    async def race() -> None:
        async with anyio.create_task_group() as tasks:
            for who, s in enumerate(writers):
                tasks.start_soon(write, s, who)

    anyio.run(race)
    revisions = history(writers[0], ("ns",), "k")
    assert len(revisions) == 12 and [r.state for r in revisions].count("current") == 1
    item = writers[0].get(("ns",), "k")
    assert item is not None and item.value["i"] == 5
    assert item.created_at == revisions[-1].entry.created_at


# -- 3. TTLs -------------------------------------------------------------------------------


def expires(s: OpenWopStore, namespace: tuple[str, ...], key: str) -> datetime:
    current = history(s, namespace, key)[0]
    assert current.state == "current" and current.entry.expires_at is not None
    return current.entry.expires_at


def near(when: datetime, minutes: float) -> bool:
    return abs(when - (datetime.now(UTC) + timedelta(minutes=minutes))) < timedelta(seconds=20)


def test_a_put_s_ttl_and_the_default_ttl_set_the_expiry(shared_sidecar: Sidecar) -> None:
    config: TTLConfig = {"default_ttl": 30.0, "refresh_on_read": False}
    s = OpenWopStore(str(shared_sidecar.socket), tenant=f"lg-{uuid.uuid4().hex[:8]}", ttl=config)
    assert s.supports_ttl and s.ttl_config == config
    s.put(("ns",), "given", {"v": 1}, ttl=5)
    s.put(("ns",), "default", {"v": 2})
    s.put(("ns",), "never", {"v": 3}, ttl=None)
    assert near(expires(s, ("ns",), "given"), 5)
    assert near(expires(s, ("ns",), "default"), 30)
    assert history(s, ("ns",), "never")[0].entry.expires_at is None


def test_an_expired_item_is_gone(shared_sidecar: Sidecar) -> None:
    s = store(shared_sidecar)
    s.put(("ns",), "k", {"v": 1}, ttl=1 / 60)  # one second
    assert s.get(("ns",), "k", refresh_ttl=False) is not None
    time.sleep(1.5)
    assert s.get(("ns",), "k") is None
    assert s.search(("ns",)) == []


def test_a_read_refreshes_the_ttl_unless_told_not_to(shared_sidecar: Sidecar) -> None:
    s = store(shared_sidecar)
    s.put(("ns",), "k", {"v": 1}, ttl=10)
    s.put(("ns",), "j", {"v": 2}, ttl=10)
    first = s.get(("ns",), "k", refresh_ttl=False)
    written = expires(s, ("ns",), "k")
    time.sleep(0.05)
    assert len(history(s, ("ns",), "k")) == 1  # refresh_ttl=False wrote nothing
    refreshed = s.get(("ns",), "k")  # LangGraph refreshes on read by default
    assert refreshed is not None and first is not None and refreshed.value == {"v": 1}
    assert expires(s, ("ns",), "k") > written
    assert len(history(s, ("ns",), "k")) == 2  # the cost: a revision per refresh
    again = s.get(("ns",), "k", refresh_ttl=False)
    assert again is not None and again.updated_at == first.updated_at  # not an update
    assert again.created_at == first.created_at
    searched = expires(s, ("ns",), "j")
    time.sleep(0.05)
    s.search(("ns",), filter={"v": 2})
    assert expires(s, ("ns",), "j") > searched


def test_refresh_on_read_false_in_the_ttl_config_refreshes_nothing(
    shared_sidecar: Sidecar,
) -> None:
    s = store(shared_sidecar, ttl={"refresh_on_read": False})
    s.put(("ns",), "k", {"v": 1}, ttl=10)
    s.get(("ns",), "k")
    s.search(("ns",))
    assert len(history(s, ("ns",), "k")) == 1


def test_a_refresh_never_overwrites_the_batch_s_own_put(shared_sidecar: Sidecar) -> None:
    s = store(shared_sidecar)
    s.put(("ns",), "k", {"v": 1}, ttl=10)
    s.batch([GetOp(("ns",), "k"), PutOp(("ns",), "k", {"v": 2}, ttl=None)])
    item = s.get(("ns",), "k")
    assert item is not None and item.value == {"v": 2}
    assert history(s, ("ns",), "k")[0].entry.expires_at is None


# -- 4. index=False and relevance ------------------------------------------------------------


def test_index_false_keeps_an_item_out_of_query_search_only(shared_sidecar: Sidecar) -> None:
    ours, theirs = store(shared_sidecar), InMemoryStore()
    for s in (ours, theirs):
        s.put(("ns",), "hidden", {"text": "green tea"}, index=False)
        s.put(("ns",), "shown", {"text": "black tea"})
        s.put(("ns",), "other", {"text": "espresso"})
    assert [item.key for item in ours.search(("ns",), query="tea")] == ["shown"]
    assert ours.get(("ns",), "hidden") is not None
    listed = ours.search(("ns",), limit=10)
    assert observed(listed) == observed(theirs.search(("ns",), limit=10))
    assert ours.search(("ns",), query="cappuccino") == []  # nothing relevant, nothing found
    # LangGraph's store without an index configured returns every item for any query.
    assert len(theirs.search(("ns",), query="tea")) == 3
    assert len(theirs.search(("ns",), query="cappuccino")) == 3
    # The body's own field names are indexed too (docs/langgraph.md says so).
    assert len(ours.search(("ns",), query="value")) == 2


# -- 5. scopes are read page by page -----------------------------------------------------------


def test_listings_read_every_page(shared_sidecar: Sidecar, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lg, "_SCAN", 4)  # pages of 4: what 1000 is to the real scan
    s = store(shared_sidecar)
    s.batch([PutOp(("many",), f"k{i:02}", {"i": i}) for i in range(11)])
    s.batch([PutOp(("ns", f"n{i:02}"), "k", {"i": i}) for i in range(9)])
    assert len(s.search(("many",), limit=100)) == 11
    assert len(s.search(("many",), filter={"i": {"$gte": 2}}, limit=100)) == 9
    assert len(s.list_namespaces(prefix=("ns",), limit=100)) == 9
    assert len(s.search(("ns",), limit=100)) == 9


def test_a_batch_reads_the_registry_once(
    shared_sidecar: Sidecar, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = store(shared_sidecar)
    s.batch([PutOp(("a",), "k", {"v": 1}), PutOp(("b",), "k", {"v": 2})])
    real = AsyncMemoryRun.page
    pages: list[str] = []

    async def counted(self: AsyncMemoryRun, scope: str, **kwargs: Any) -> Any:
        pages.append(scope)
        return await real(self, scope, **kwargs)

    monkeypatch.setattr(AsyncMemoryRun, "page", counted)
    found = s.batch([SearchOp(("a",)), SearchOp(("b",)), ListNamespacesOp()])
    assert [len(one) for one in found if isinstance(one, list)] == [1, 1, 2]
    assert len(pages) == 3 and len(set(pages)) == 3  # the registry's, a's and b's


# -- 6. the namespace registry is pruned ------------------------------------------------------


def test_a_namespace_s_last_delete_unlists_it(shared_sidecar: Sidecar) -> None:
    s = store(shared_sidecar)
    s.put(("a",), "k1", {"v": 1})
    s.put(("a",), "k2", {"v": 2})
    s.put(("b",), "k", {"v": 3})
    s.delete(("a",), "k1")
    assert s.list_namespaces() == [("a",), ("b",)]
    s.delete(("a",), "k2")
    assert s.list_namespaces() == [("b",)]
    theirs = InMemoryStore()  # which keeps an emptied namespace (docs/langgraph.md says so)
    theirs.put(("a",), "k1", {"v": 1})
    theirs.delete(("a",), "k1")
    assert theirs.list_namespaces() == [("a",)]
    s.batch([PutOp(("b",), "k", None), PutOp(("b",), "j", {"v": 4})])
    assert s.list_namespaces() == [("b",)]  # a batch that also puts there keeps it
    s.put(("a",), "k1", {"v": 5})
    assert s.list_namespaces() == [("a",), ("b",)]


def test_a_put_racing_the_prune_stays_listed(
    shared_sidecar: Sidecar, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = store(shared_sidecar)
    other = store(shared_sidecar, tenant=s._tenant)
    s.put(("a",), "k", {"v": 1})
    real = lg._Scopes.live_count
    calls: list[int] = []

    async def emptied_then_put(self: lg._Scopes, scope: str) -> int:
        count = await real(self, scope)
        if not calls:  # between the first check and the registry's delete
            await other.abatch([PutOp(("a",), "j", {"v": 2})])
        calls.append(count)
        return count

    monkeypatch.setattr(lg._Scopes, "live_count", emptied_then_put)
    s.delete(("a",), "k")
    monkeypatch.undo()
    assert calls == [0, 1]
    assert s.list_namespaces() == [("a",)]
    assert [item.key for item in s.search(("a",))] == ["j"]


def test_a_refused_begin_raises_its_own_error_and_leaves_no_run(shared_sidecar: Sidecar) -> None:
    """The run begins while the batch's refs are issued; a begin the sidecar refuses (here
    a secret too short to redact by) is raised as itself, not wrapped in a group."""
    s = OpenWopStore(str(shared_sidecar.socket), tenant="lg-refused", secrets={"k": "short"})
    with pytest.raises(MemoryValidationError) as refused:
        s.get(("ns",), "k")
    assert refused.value.details.get("field", "").startswith("secrets")
    assert "short" not in str(refused.value)
