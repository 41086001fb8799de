"""`openwop-memory mcp` driven by the MCP SDK's own client, over stdio and streamable HTTP
(on a Unix socket, behind a bearer token), against one real sidecar shared by the module.

What is shown: two sessions writing to one scope concurrently lose nothing; one session reads
one snapshot and a replayed session reads its original one; a secret registered for the
session never comes back; tool errors are well-formed MCP error results carrying a kind and
no argument's value; another tenant's ref answers as an unknown one does.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import stat
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from openwop_memory_client import AsyncMemoryClient
from support.examples import python_block, run_example, says_it_prints
from support.schemas import check_entry, check_mcp_capabilities
from support.sidecar import EXE, Sidecar, run_cli, socket_workdir

# The MCP server sits above the client: which backend the sidecar stores in is not its
# subject (the PostgreSQL pass of `make test` would run it again for nothing).
pytestmark = [pytest.mark.anyio, pytest.mark.backend_independent]

ROOT = Path(__file__).resolve().parents[2]
TENANT = "mcp-acme"
SECRET = "sk-mcp-file-9f3c2a7d41e8b6"  # registered for every session by --secrets-file
TOKEN = "mcp-test-token-0123456789abcdef"


class HttpServer:
    def __init__(self, proc: subprocess.Popen[bytes], uds: Path, log: Path) -> None:
        self.proc, self.uds, self.log = proc, uds, log


@pytest.fixture(scope="module")
def mcp_http(
    shared_sidecar: Sidecar, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HttpServer]:
    """`openwop-memory mcp --transport http` on a Unix socket, with a token and secrets file."""
    with socket_workdir(tmp_path_factory.mktemp("mcp")) as workdir:
        secrets = workdir / "secrets.json"
        secrets.write_text(json.dumps({"filekey": SECRET}))
        token = workdir / "token"
        token.write_text(TOKEN + "\n")
        uds = workdir / "mcp.sock"
        log = workdir / "mcp.log"
        argv = [EXE, "mcp", *_common(shared_sidecar, secrets), "--transport", "http"]
        argv += ["--unix-socket", str(uds), "--auth-token-file", str(token)]
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while not _listening(uds):
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            # Only this user may connect (uvicorn's own socket would be 0666).
            assert stat.S_IMODE(uds.stat().st_mode) == 0o600
            yield HttpServer(proc, uds, log)
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def _common(sidecar: Sidecar, secrets: Path) -> list[str]:
    return ["--socket", str(sidecar.socket), "--tenant", TENANT, "--secrets-file", str(secrets)]


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
        return True


@asynccontextmanager
async def http_session(server: HttpServer, token: str = TOKEN) -> AsyncIterator[Client]:
    transport = httpx2.AsyncHTTPTransport(uds=str(server.uds))
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(transport=transport, headers=headers, timeout=30) as http,
        Client(streamable_http_client("http://localhost/mcp", http_client=http)) as client,
    ):
        yield client


@asynccontextmanager
async def stdio_session(sidecar: Sidecar, secrets: Path) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=EXE, args=["mcp", *_common(sidecar, secrets)])
    async with Client(params) as client:
        yield client


T = TypeVar("T")


async def own_loop(body: Callable[[], Awaitable[T]]) -> T:
    """``body()`` on an event loop of its own, in a worker thread. For the SDK's stdio client:
    after its session closes, a callback of the asyncio subprocess it ran can still fire,
    and fail (InvalidStateError), on the loop the module's later tests share."""
    return await anyio.to_thread.run_sync(lambda: anyio.run(body))


def fresh_loop(test: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """The test on a loop of its own (:func:`own_loop`): the SDK's HTTP client, too, can
    leave a callback behind at close that fails on the shared loop of later tests."""

    @functools.wraps(test)
    async def wrapper(*args: Any, **kwargs: Any) -> None:
        await own_loop(lambda: test(*args, **kwargs))

    return wrapper


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.structured_content
    body: dict[str, Any] = result.structured_content
    assert json.loads(result.content[0].text) == body  # type: ignore[union-attr]
    return body


async def error_of(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert result.is_error
    body: dict[str, Any] = result.structured_content
    assert json.loads(result.content[0].text) == body  # type: ignore[union-attr]
    assert set(body) <= {"error", "message", "field"} and body["message"]
    return body


async def scope(client: Client, agent: str) -> str:
    ref: str = (await call(client, "memory_scope", agent=agent))["memoryRef"]
    return ref


@fresh_loop
async def test_stdio_tools_carry_schemas_annotations_and_the_rfc_0020_capabilities(
    shared_sidecar: Sidecar, tmp_path: Path
) -> None:
    secrets = tmp_path / "secrets.json"
    secrets.write_text("{}")

    async def session() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with stdio_session(shared_sidecar, secrets) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            experimental = client.server_capabilities.experimental or {}
            ref = await scope(client, "stdio-agent")
            put = await call(client, "memory_put", memoryRef=ref, content="tea at four", tags=["t"])
        return tools, experimental, put

    tools, experimental, put = await own_loop(session)
    assert put["entry"]["content"] == "tea at four" and put["entry"]["tags"] == ["t"]
    check_entry(put["entry"])
    expected = {
        "memory_scope": (True, False),
        "memory_search": (True, False),
        "memory_list": (True, False),
        "memory_get": (True, False),
        "memory_put": (False, False),
        "memory_delete": (False, True),
    }
    for name, (read_only, destructive) in expected.items():
        annotations = tools[name].annotations
        assert annotations is not None
        assert (annotations.read_only_hint, annotations.destructive_hint) == (
            read_only,
            destructive,
        )
        assert annotations.idempotent_hint is True
        assert tools[name].input_schema["type"] == "object"
        assert tools[name].input_schema["additionalProperties"] is False
    assert {"query", "tokenBudget", "tags", "createdAfter", "createdBefore"} <= set(
        tools["memory_search"].input_schema["properties"]
    )
    assert "idempotencyKey" in tools["memory_put"].input_schema["properties"]
    # The capabilities object validates against the contract's `capabilities.mcp` schema.
    printed = run_cli("mcp", "--capabilities")
    assert printed.returncode == 0, printed.stderr
    caps = json.loads(printed.stdout)["capabilities"]
    assert experimental["openwop"] == caps
    assert caps["mcp"]["serverMount"]["transports"] == ["stdio", "streamable-http"]
    check_mcp_capabilities(caps["mcp"])


@fresh_loop
async def test_two_sessions_writing_one_scope_concurrently_lose_nothing(
    mcp_http: HttpServer,
) -> None:
    per_session = 15
    ids: list[str] = []
    async with http_session(mcp_http) as first, http_session(mcp_http) as second:
        ref = await scope(first, "concurrent")
        assert await scope(second, "concurrent") == ref

        async def write(client: Client, who: str) -> None:
            for i in range(per_session):
                body = await call(client, "memory_put", memoryRef=ref, content=f"{who} note {i}")
                ids.append(body["entry"]["id"])

        async with anyio.create_task_group() as tg:
            tg.start_soon(write, first, "first")
            tg.start_soon(write, second, "second")
    async with http_session(mcp_http) as reader:
        listed = await call(reader, "memory_list", memoryRef=ref, limit=1000)
    contents = sorted(entry["content"] for entry in listed["entries"])
    expected = sorted(f"{who} note {i}" for who in ("first", "second") for i in range(per_session))
    assert contents == expected
    assert sorted(entry["id"] for entry in listed["entries"]) == sorted(ids)


@fresh_loop
async def test_a_session_reads_one_snapshot_and_a_replay_reads_the_original(
    mcp_http: HttpServer, shared_sidecar: Sidecar
) -> None:
    async with http_session(mcp_http) as writer:
        ref = await scope(writer, "snapshots")
        first_run = (await call(writer, "session_info"))["runId"]
        put = await call(writer, "memory_put", memoryRef=ref, content="written in session one")
        # The session's reads stay on its snapshot: its own write is after it.
        assert (await call(writer, "memory_list", memoryRef=ref))["entries"] == []
        async with AsyncMemoryClient(shared_sidecar.socket) as raw:
            open_runs = (await raw.stats())["activeRuns"]
    async with AsyncMemoryClient(shared_sidecar.socket) as raw:
        # Closing the session (the SDK's DELETE) ends its run (the teardown may trail the
        # DELETE's answer a little).
        deadline = time.monotonic() + 5
        while (await raw.stats())["activeRuns"] != open_runs - 1:
            assert time.monotonic() < deadline, "the session's run is still open"
            await anyio.sleep(0.02)
    async with http_session(mcp_http) as later:
        seen = await call(later, "memory_list", memoryRef=ref)
        assert seen["entries"] == [put["entry"]]
        assert (await call(later, "memory_get", memoryRef=ref, id=put["entry"]["id"]))[
            "entry"
        ] == put["entry"]
        replayed = await call(later, "session_replay", runId=first_run)
        assert replayed["runId"] == first_run and replayed["replay"] is True
        assert (await call(later, "memory_list", memoryRef=ref))["entries"] == []
        never = await error_of(later, "session_replay", runId="mcp-never-begun")
        assert never["error"] == "replay_memory_snapshot_unavailable"
    # put is idempotent by key: the same key and entry write once.
    async with http_session(mcp_http) as again:
        one = await call(again, "memory_put", memoryRef=ref, content="once", idempotencyKey="k-1")
        two = await call(again, "memory_put", memoryRef=ref, content="once", idempotencyKey="k-1")
        assert one["entry"]["id"] == two["entry"]["id"]
        other = await error_of(
            again, "memory_put", memoryRef=ref, content="different", idempotencyKey="k-1"
        )
        assert other["error"] == "conflict"


@fresh_loop
async def test_a_secret_registered_for_the_session_never_comes_back(
    mcp_http: HttpServer, shared_sidecar: Sidecar, tmp_path: Path
) -> None:
    added = "tool-added-secret-77c1e0b95a"
    async with http_session(mcp_http) as client:
        ref = await scope(client, "secrets")
        assert (await call(client, "session_add_secrets", secrets={"toolkey": added}))["count"] == 2
        stored = await call(
            client, "memory_put", memoryRef=ref, content=f"keys {SECRET} and {added}"
        )
        assert stored["entry"]["content"] == "keys [REDACTED:filekey] and [REDACTED:toolkey]"
        info = await call(client, "session_info")
    secrets = tmp_path / "secrets.json"
    secrets.write_text("{}")

    async def read() -> list[Any]:
        async with stdio_session(shared_sidecar, secrets) as reader:
            return [
                await client_call_raw(reader, "memory_list", memoryRef=ref),
                await client_call_raw(reader, "memory_search", memoryRef=ref, query="keys"),
                await client_call_raw(
                    reader, "memory_get", memoryRef=ref, id=stored["entry"]["id"]
                ),
            ]

    answers = await own_loop(read)
    text = json.dumps(answers) + json.dumps(info)
    assert "[REDACTED:filekey]" in text
    assert SECRET not in text and added not in text
    assert SECRET not in mcp_http.log.read_text() and added not in mcp_http.log.read_text()


async def client_call_raw(client: Client, tool: str, **arguments: Any) -> Any:
    result = await client.call_tool(tool, arguments)
    return result.model_dump(mode="json")


@fresh_loop
async def test_tool_errors_are_well_formed_and_another_tenants_ref_is_not_found(
    mcp_http: HttpServer, shared_sidecar: Sidecar
) -> None:
    async with AsyncMemoryClient(shared_sidecar.socket) as raw:
        foreign = await raw.issue_ref("mcp-other-tenant", "agent")
        async with raw.run("mcp-other-run", "mcp-other-tenant") as other:
            theirs = await other.put(foreign, "the other tenant's note")
    marker = "zz-content-never-echoed-31"
    async with http_session(mcp_http) as client:
        ref = await scope(client, "errors")
        unknown = await error_of(client, "memory_get", memoryRef=ref, id="mem_unknown")
        foreign_get = await error_of(client, "memory_get", memoryRef=foreign, id=theirs.id)
        assert unknown == foreign_get == {"error": "not_found", "message": unknown["message"]}
        assert (await call(client, "memory_list", memoryRef=foreign))["entries"] == []
        assert (await call(client, "memory_search", memoryRef=foreign, query="note"))[
            "entries"
        ] == []
        assert await call(client, "memory_delete", memoryRef=foreign, id=theirs.id) == {
            "deleted": False
        }
        assert (await error_of(client, "memory_put", memoryRef=foreign, content=marker))[
            "error"
        ] == "not_found"
        bad = await error_of(client, "memory_put", memoryRef=ref, content=marker, tags=[marker, 5])
        assert bad == {"error": "validation_error", "message": bad["message"], "field": "tags.1"}
        missing = await error_of(client, "memory_get", memoryRef=ref)
        assert missing["field"] == "id"
        extra = await error_of(client, "memory_list", memoryRef=ref, **{marker: 1})
        assert "field" not in extra
        when = await error_of(client, "memory_list", memoryRef=ref, createdAfter="yesterday")
        assert when["field"] == "createdAfter"
        assert (await error_of(client, "no_such_tool"))["error"] == "unknown_tool"
        # delete: the entry goes, and a second delete reports there was none.
        mine = await call(client, "memory_put", memoryRef=ref, content="to delete")
        assert await call(client, "memory_delete", memoryRef=ref, id=mine["entry"]["id"]) == {
            "deleted": True
        }
        assert await call(client, "memory_delete", memoryRef=ref, id=mine["entry"]["id"]) == {
            "deleted": False
        }
        everything = json.dumps([unknown, bad, missing, extra, when])
    assert marker not in everything
    async with (
        AsyncMemoryClient(shared_sidecar.socket) as raw,
        raw.run("mcp-other-check", "mcp-other-tenant") as other,
    ):
        assert await other.get(foreign, theirs.id) is not None  # the foreign delete did nothing


@fresh_loop
async def test_http_serves_loopback_and_refuses_no_token_and_other_addresses_without_auth(
    mcp_http: HttpServer, shared_sidecar: Sidecar
) -> None:
    transport = httpx2.AsyncHTTPTransport(uds=str(mcp_http.uds))
    async with httpx2.AsyncClient(transport=transport) as http:
        for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}):
            answer = await http.post("http://localhost/mcp", json={}, headers=headers)
            assert answer.status_code == 401
        # With the token, a Host that is not a loopback name is refused (DNS rebinding).
        rebound = {"Authorization": f"Bearer {TOKEN}", "Host": "attacker.example"}
        answer = await http.post("http://localhost/mcp", json={}, headers=rebound)
        assert answer.status_code == 421
    refused = run_cli("mcp", "--tenant", "t", "--transport", "http", "--host", "0.0.0.0")  # noqa: S104 - refused
    assert refused.returncode == 2
    assert "not a loopback address" in refused.stderr
    no_tenant = run_cli("mcp")
    assert no_tenant.returncode == 2 and "--tenant" in no_tenant.stderr


@fresh_loop
async def test_the_docs_example_session_runs_and_prints_what_it_says(
    shared_sidecar: Sidecar, tmp_path: Path
) -> None:

    code = python_block(ROOT / "docs" / "mcp.md", after="## An MCP client session")
    env = dict(os.environ)  # measured: the MCP server it starts is the code under test
    env["PATH"] = f"{os.path.dirname(EXE)}:{env.get('PATH', '')}"  # `openwop-memory` as installed
    printed = await anyio.to_thread.run_sync(
        lambda: run_example(code, shared_sidecar.socket, tmp_path, env)
    )
    says_it_prints(code, printed, "docs/mcp.md")
    assert printed[-1] == "stored: deploy key is [REDACTED:deploy]"


@fresh_loop
async def test_stdio_tenancy_is_the_spawning_users_under_the_sidecars_tenant_binding(
    tmp_path: Path,
) -> None:
    """The server connects as the user who spawned it: the sidecar's binding for that user
    decides which `--tenant` works (here this user may use `mcp-allowed` only)."""
    secrets = tmp_path / "secrets.json"
    secrets.write_text("{}")
    table = json.dumps({f"uid:{os.geteuid()}": ["mcp-allowed"]})
    with socket_workdir(tmp_path) as workdir, Sidecar(workdir, "--tenant-binding", table) as bound:
        params = StdioServerParameters(
            command=EXE,
            args=["mcp", "--socket", str(bound.socket), "--tenant", "mcp-allowed"],
        )

        async def sessions() -> tuple[dict[str, Any], dict[str, Any]]:
            async with Client(params) as allowed:
                ref = await scope(allowed, "agent")
                await call(allowed, "memory_put", memoryRef=ref, content="bound")
            params.args[-1] = "mcp-denied"
            async with Client(params) as denied:
                refused = await error_of(denied, "memory_scope", agent="agent")
                listed = await error_of(denied, "memory_list", memoryRef=ref)
            return refused, listed

        refused, listed = await own_loop(sessions)
    assert refused["error"] == listed["error"] == "forbidden"
