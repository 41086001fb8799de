"""The LangGraph store (``openwop_memory_client.langgraph_store``) against a real sidecar:
LangGraph's own calls (``put``/``get``/``search``/``delete``/``list_namespaces`` and
``abatch``) on namespaces mapped to scopes and keys to keyed entries."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import anyio
import pytest
from langgraph.store.base import GetOp, Item, PutOp, Result
from openwop_memory_client import MemoryClient
from openwop_memory_client.langgraph_store import OpenWopStore
from support.sidecar import Sidecar, unmeasured

ROOT = Path(__file__).resolve().parents[1]

SECRET = "sk-lg-7c2e91ab44f0d3"


def store(sidecar: Sidecar) -> OpenWopStore:
    # A tenant of its own per test: the module's sidecar is shared.
    return OpenWopStore(
        str(sidecar.socket), tenant=f"lg-{uuid.uuid4().hex[:8]}", secrets={"lgkey": SECRET}
    )


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
    assert s.list_namespaces() == []


def test_the_docs_graph_runs_and_prints_what_it_says(
    shared_sidecar: Sidecar, tmp_path: Path
) -> None:
    from test_client_docs import python_block

    code = python_block(ROOT / "docs" / "langgraph.md", after="## A small graph using the store")
    env = {**unmeasured(os.environ), "OPENWOP_MEMORY_SOCKET": str(shared_sidecar.socket)}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    assert printed == ["recalled: ['the key is [REDACTED:api]']", "namespaces: [('notes', 'ada')]"]
    for line in printed:
        assert f"# {line}" in code, f"docs/langgraph.md does not say it prints {line!r}"
