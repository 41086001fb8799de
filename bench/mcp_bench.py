"""What a memory call costs through `openwop-memory mcp` (streamable HTTP on a Unix socket,
the SDK's own client) against the same call straight to the sidecar's socket: p50 of one
client's sequential calls, and CPU per call of the MCP server process and of the sidecar."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from openwop_memory_client import AsyncMemoryClient

from bench.measure import percentile
from bench.proc import ServerProcess, process_cpu_seconds, wait_for_socket
from bench.report import Metric, SuiteResult

TENANT = "bench-mcp"


async def _timed(
    call: Callable[[], Awaitable[object]], calls: int, pids: list[int]
) -> tuple[float, list[float]]:
    """p50 seconds of ``calls`` sequential calls, and the CPU seconds per call of each pid."""
    for _ in range(max(10, calls // 10)):
        await call()
    before = [process_cpu_seconds(pid) for pid in pids]
    latencies: list[float] = []
    for _ in range(calls):
        start = time.perf_counter()
        await call()
        latencies.append(time.perf_counter() - start)
    after = [process_cpu_seconds(pid) for pid in pids]
    latencies.sort()
    return percentile(latencies, 0.5), [(a - b) / calls for a, b in zip(after, before, strict=True)]


async def run_mcp(sidecar_exe: str, workdir: Path, calls: int) -> SuiteResult:
    exe = sidecar_exe or os.path.join(os.path.dirname(sys.executable), "openwop-memory")
    sock, mcp_sock = workdir / "memory.sock", workdir / "mcp.sock"
    sidecar = ServerProcess(
        [exe, "serve", "--socket", str(sock), "--database", f"sqlite:///{workdir}/memory.db"],
        workdir / "sidecar.log",
    )
    mcp_server = ServerProcess(
        [
            exe,
            "mcp",
            "--socket",
            str(sock),
            "--tenant",
            TENANT,
            "--transport",
            "http",
            "--unix-socket",
            str(mcp_sock),
        ],
        workdir / "mcp.log",
    )
    sidecar.start()
    try:
        await wait_for_socket(sock, sidecar)
        mcp_server.start()
        try:
            await wait_for_socket(mcp_sock, mcp_server)
            return await _measure(sock, mcp_sock, calls, sidecar.pid, mcp_server.pid)
        finally:
            mcp_server.stop(timeout=10)
    finally:
        sidecar.stop(timeout=10)


async def _measure(sock: Path, mcp_sock: Path, calls: int, sidecar: int, mcp: int) -> SuiteResult:
    async with AsyncMemoryClient(sock) as raw:
        ref = await raw.issue_ref(TENANT, "bench")
        async with raw.run("bench-mcp-writer", TENANT) as writer:
            entry = await writer.put(ref, "a short note to read back")
        async with raw.run("bench-mcp-reader", TENANT) as reader:
            raw_p50, (raw_sidecar_cpu,) = await _timed(
                lambda: reader.get(ref, entry.id), calls, [sidecar]
            )
    transport = httpx2.AsyncHTTPTransport(uds=str(mcp_sock))
    async with (
        httpx2.AsyncClient(transport=transport, timeout=30) as http,
        Client(streamable_http_client("http://localhost/mcp", http_client=http)) as client,
    ):
        arguments = {"memoryRef": ref, "id": entry.id}

        async def tool_call() -> None:
            result = await client.call_tool("memory_get", arguments)
            assert not result.is_error, result.structured_content

        mcp_p50, (mcp_cpu, mcp_sidecar_cpu) = await _timed(tool_call, calls, [mcp, sidecar])
    return SuiteResult(
        metrics=[
            Metric("mcp: raw socket get p50", raw_p50 * 1e6, "us"),
            Metric("mcp: memory_get tool call p50 (HTTP, Unix socket)", mcp_p50 * 1e6, "us"),
            Metric("mcp: tool call p50 / raw get p50", mcp_p50 / raw_p50, "x"),
            Metric("mcp: MCP server CPU per tool call", mcp_cpu * 1e6, "us"),
            Metric("mcp: sidecar CPU per raw get", raw_sidecar_cpu * 1e6, "us"),
            Metric("mcp: sidecar CPU per tool call", mcp_sidecar_cpu * 1e6, "us"),
        ]
    )
