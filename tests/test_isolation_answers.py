"""Issue 20, rows 2 and 7: what a client that asks for big answers, or never reads them, or
holds unfinished lines, can make the sidecar hold; run as the attack, against a real
sidecar process with small limits set by flags."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson
import pytest
from support.names import uid
from support.protocol import new_run
from support.schemas import check_entry, check_envelope
from support.sidecar import RawClient, Sidecar

TENANT = "t1"


@pytest.fixture
def scratch() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def _rss_kib(sidecar: Sidecar, field: str = "VmRSS") -> int:
    assert sidecar.proc is not None
    for line in Path(f"/proc/{sidecar.proc.pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def _store(client: RawClient, count: int, content_bytes: int) -> tuple[str, str]:
    """``count`` entries of ``content_bytes`` in a new scope; (a run that sees them, the ref)."""
    ref = uid("ref")
    writer = new_run(client)
    for i in range(count):
        content = f"{i:04d}" + "x" * (content_bytes - 4)
        client.call("memory.put", runId=writer, memoryRef=ref, entry={"content": content})
    return new_run(client), ref


def _request(rid: int, method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


def _line(message: Any) -> bytes:
    return orjson.dumps(message) + b"\n"


# -- row 2 (a): a list answer is bounded in bytes --------------------------------------------


def test_a_list_returns_the_entries_that_fit_the_answer_byte_budget(
    workdir: Path, scratch: ExitStack
) -> None:
    """Before: a list answered ``limit`` entries whatever their size (1000 entries of 60 KB
    made one 60 MB answer). Now, with ``--max-answer-bytes 16384``: the entries returned are
    the longest prefix of the list whose JSON fits 16 KiB, newest first as always; an entry
    larger than the budget alone is still returned (alone), so no entry is unreachable."""
    sidecar = scratch.enter_context(Sidecar(workdir, "--max-answer-bytes", "16384"))
    client = scratch.enter_context(sidecar.client())
    run, ref = _store(client, 20, 3000)
    listed = client.call("memory.list", runId=run, memoryRef=ref, options={"limit": 20})
    for entry in listed:
        check_entry(entry)
    assert [int(e["content"][:4]) for e in listed] == list(range(19, 19 - len(listed), -1))
    sizes = [len(orjson.dumps(e)) + 1 for e in listed]
    assert sum(sizes) <= 16384 < sum(sizes) + sizes[0], sizes  # the longest prefix that fits
    assert len(listed) == 5
    # The plain list (no options) and a relevance list obey it too.
    assert len(client.call("memory.list", runId=run, memoryRef=ref)) == 5
    options = {"rank": "relevance", "query": "xxxx", "limit": 20}
    assert len(client.call("memory.list", runId=run, memoryRef=ref, options=options)) <= 5

    big_run, big_ref = _store(client, 2, 20_000)
    (alone,) = client.call("memory.list", runId=big_run, memoryRef=big_ref)
    assert alone["content"].startswith("0001")


# -- row 2 (b): a batch's answers count against the unread-answer budget ----------------------


def test_a_batch_refuses_its_members_once_their_answers_fill_the_unsent_budget(
    workdir: Path, scratch: ExitStack
) -> None:
    """Before: a batch of 128 lists built every answer before anything was sent (1.5 GiB
    for 128 lists of 1000 60 KB entries). Now, with ``--max-unsent-answer-bytes 65536``
    (lists then hold at most 32 KiB): the batch runs its members in order while their
    answers fit the connection's budget; the members past it get ``rate_limited`` with
    ``retryAfterMs``, the line stays within the budget, and another client is served."""
    sidecar = scratch.enter_context(Sidecar(workdir, "--max-unsent-answer-bytes", "65536"))
    client = scratch.enter_context(sidecar.client())
    run, ref = _store(client, 20, 3000)
    members = [
        _request(i, "memory.list", runId=run, memoryRef=ref, options={"limit": 20})
        for i in range(128)
    ]
    client.sock.sendall(_line(members))
    raw = client.reader.readline()
    answers = orjson.loads(raw)
    # What the served members answered fits the budget; the refusals are short lines.
    served_bytes = sum(len(orjson.dumps(a)) + 1 for a in answers if "result" in a)
    assert served_bytes <= 65536, served_bytes
    assert len(raw) <= 65536 + 128 * 300, len(raw)
    assert [a["id"] for a in answers] == list(range(128))
    served = [a for a in answers if "result" in a]
    refused = [a for a in answers if "error" in a]
    assert served and answers[: len(served)] == served, "a prefix of the batch is served"
    assert len(refused) >= 120
    for answer in refused:
        check_envelope(answer["error"])
        data = answer["error"]["data"]
        assert data["error"] == "rate_limited" and data["details"]["retryAfterMs"] > 0
    for answer in served:
        assert 0 < len(answer["result"]) < 20
    stats = client.call("sidecar.stats")["requests"]["memory.list"]
    assert stats["rate_limited"] == len(refused)
    with sidecar.client(timeout=5) as bystander:
        assert bystander.call("sidecar.health")["status"] == "ok"
