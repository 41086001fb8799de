"""The client against a sidecar that answers wrongly: every malformed answer becomes the
library's :class:`InternalError` (or, for an error object, the closest typed error), never
a ``KeyError``, a pydantic error or a half-built entry, and no message quotes the answer's
content.

The "sidecar" is a scripted JSON-RPC server on a real Unix socket: it answers each
method with the result (or the whole response object) the test gives it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from openwop_memory_client import (
    AsyncMemoryClient,
    AsyncMemoryRun,
    InternalError,
    MethodNotFoundError,
    NotFoundError,
    RunNotFoundError,
)

pytestmark = [pytest.mark.anyio, pytest.mark.backend_independent]

CONTENT = "private note 7f3a"
BEGUN = {"runId": "r1", "tenant": "t1", "snapshotAt": "2026-12-01T00:00:00.000000Z"}
GOOD_ENTRY = {"id": "e1", "content": CONTENT, "tags": [], "createdAt": BEGUN["snapshotAt"]}

# A response's members besides jsonrpc and id; a method missing here gets {"result": None}.
Script = dict[str, dict[str, Any]]


async def _serve(stream: anyio.abc.ByteStream, script: Script) -> None:
    received = BufferedByteReceiveStream(stream)
    suppressed = (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError)
    async with stream:
        with contextlib.suppress(*suppressed):
            while True:
                request = json.loads(await received.receive_until(b"\n", 1 << 20))
                answer = script.get(request["method"], {"result": None})
                line = {"jsonrpc": "2.0", "id": request["id"], **answer}
                await stream.send(json.dumps(line).encode() + b"\n")


@contextlib.asynccontextmanager
async def scripted(path: Path, script: Script) -> AsyncIterator[AsyncMemoryClient]:
    """A client connected to a server answering by ``script`` (run.begin answers well
    unless the script says otherwise)."""
    listener = await anyio.create_unix_listener(path)
    full = {"run.begin": {"result": {**BEGUN, "resumed": False}}, **script}
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, lambda s: _serve(s, full))
        try:
            async with AsyncMemoryClient(path, timeout=5) as client:
                yield client
        finally:
            tg.cancel_scope.cancel()


async def _in_run(
    client: AsyncMemoryClient, act: Callable[[AsyncMemoryRun], Awaitable[Any]]
) -> Any:
    async with client.run("r1", "t1") as run:
        return await act(run)


CLIENT_CALLS: dict[str, Callable[[AsyncMemoryClient], Awaitable[Any]]] = {
    "host.capabilities": lambda c: c.capabilities(),
    "memory.issueRef": lambda c: c.issue_ref("t1", "a1"),
    "sidecar.health": lambda c: c.health(),
    "run.begin": lambda c: _in_run(c, lambda r: anyio.lowlevel.checkpoint()),
    "memory.list": lambda c: _in_run(c, lambda r: r.list("ref")),
    "memory.get": lambda c: _in_run(c, lambda r: r.get("ref", "e1")),
    "memory.put": lambda c: _in_run(c, lambda r: r.put("ref", "x")),
    "memory.delete": lambda c: _in_run(c, lambda r: r.delete("ref", "e1")),
    "run.addSecrets": lambda c: _in_run(c, lambda r: r.add_secrets({"k": "v" * 12})),
}

MALFORMED_RESULTS: list[tuple[str, Any]] = [
    ("host.capabilities", {"capabilities": "none"}),
    ("host.capabilities", []),
    ("memory.issueRef", {"memoryRef": 7}),
    ("sidecar.health", "ok"),
    ("run.begin", {"runId": "r1"}),
    ("memory.list", {"entries": [GOOD_ENTRY]}),
    ("memory.list", [{**GOOD_ENTRY, "tags": [1]}]),
    ("memory.get", {**GOOD_ENTRY, "createdAt": 5}),
    ("memory.get", {**GOOD_ENTRY, "createdAt": "2026-12-01T00:00:00"}),
    ("memory.get", {**GOOD_ENTRY, "surprise": True}),
    ("memory.get", {k: v for k, v in GOOD_ENTRY.items() if k != "content"}),
    ("memory.get", ["e1", CONTENT]),
    ("memory.put", {**GOOD_ENTRY, "expiresAt": "tomorrow"}),
    ("memory.delete", "yes"),
    ("run.addSecrets", {"count": "3"}),
]


@pytest.mark.parametrize(("method", "result"), MALFORMED_RESULTS)
async def test_a_malformed_result_is_an_internal_error_quoting_nothing(
    tmp_path: Path, method: str, result: Any
) -> None:
    async with scripted(tmp_path / "s.sock", {method: {"result": result}}) as client:
        with pytest.raises(InternalError) as err:
            await CLIENT_CALLS[method](client)
    assert "malformed" in str(err.value), str(err.value)
    assert CONTENT not in str(err.value)


async def test_a_response_with_neither_result_nor_error_is_an_internal_error(
    tmp_path: Path,
) -> None:
    async with scripted(tmp_path / "s.sock", {"sidecar.health": {}}) as client:
        with pytest.raises(InternalError, match="neither result nor error"):
            await client.health()


@pytest.mark.parametrize(
    ("error", "expected", "message"),
    [
        ("not an object", InternalError, "malformed error response"),
        ({"code": -32000, "message": "plain failure"}, InternalError, "plain failure"),
        (
            {"code": -32001, "message": "m", "data": {"error": "not_found", "message": "gone"}},
            NotFoundError,
            "gone",
        ),
        (
            {
                "code": -32001,
                "message": "m",
                "data": {"error": "not_found", "message": "no run", "details": {"resource": "run"}},
            },
            RunNotFoundError,
            "no run",
        ),
        (
            {
                "code": -32601,
                "message": "m",
                "data": {
                    "error": "not_found",
                    "message": "no such",
                    "details": {"resource": "method"},
                },
            },
            MethodNotFoundError,
            "no such",
        ),
        (
            {"code": -32000, "message": "m", "data": {"error": "a_code_from_the_future"}},
            InternalError,
            "a_code_from_the_future",
        ),
    ],
)
async def test_an_error_object_becomes_the_closest_typed_error(
    tmp_path: Path, error: Any, expected: type[Exception], message: str
) -> None:
    async with scripted(tmp_path / "s.sock", {"sidecar.health": {"error": error}}) as client:
        with pytest.raises(expected) as err:
            await client.health()
    assert type(err.value) is expected
    assert message in str(err.value)


async def test_a_well_formed_answer_passes_through(tmp_path: Path) -> None:
    """The script itself is sound: the same server, answering well, is understood."""
    script = {"memory.get": {"result": GOOD_ENTRY}}
    async with scripted(tmp_path / "s.sock", script) as client:
        entry = await _in_run(client, lambda r: r.get("ref", "e1"))
    assert entry is not None and (entry.id, entry.content) == ("e1", CONTENT)
