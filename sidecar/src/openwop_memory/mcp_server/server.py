"""The MCP server over stdio or streamable HTTP, each session an :class:`McpSession`.

Only the handshake era of MCP has sessions, and a session is what a run is tied to; so
``server/discover`` is declined (a 2026-era client then falls back to ``initialize``, as
the SDK's ``mode="auto"`` does) and stdio is served in handshake mode. A request that
still arrives without a session (a sessionless 2026-era HTTP exchange) is a session of its
own: its run begins and ends with that one call.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import ipaddress
import os
import socket
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from openwop_memory_client import AsyncMemoryClient, OpenWopMemoryError, __version__

from .session import McpSession
from .tools import TOOLS, call_tool

_STATE_KEY = "openwop_memory.session"

TRANSPORTS = ["stdio", "streamable-http"]


def capabilities() -> dict[str, Any]:
    """This server's OpenWOP capabilities (RFC 0020's ``capabilities.mcp.serverMount``)."""
    return {
        "mcp": {
            "serverMount": {
                "supported": True,
                "transports": list(TRANSPORTS),
                "samplingBridge": False,
                "elicitationBridge": False,
            }
        }
    }


class Backend:
    """What every session shares: one client of the sidecar, the tenant, the file's secrets."""

    def __init__(self, client: AsyncMemoryClient, tenant: str, secrets: Mapping[str, str]) -> None:
        self.client = client
        self.tenant = tenant
        self.secrets = dict(secrets)


def _session_of(ctx: ServerRequestContext[Backend, Any]) -> McpSession:
    # The SDK keeps per-connection state on its Connection, which ServerSession holds but
    # does not expose (mcp 2.3); the extra pins the minor version for that reason.
    connection = ctx.session._connection
    state: MutableMapping[str, Any] = connection.state
    session = state.get(_STATE_KEY)
    if session is None:
        backend = ctx.lifespan_context
        session = McpSession(backend.client, backend.tenant, backend.secrets)
        state[_STATE_KEY] = session
        connection.exit_stack.push_async_callback(session.aclose)
    assert isinstance(session, McpSession)
    return session


class _MemoryServer(Server[Backend]):
    """The SDK's server whose initialize result carries the OpenWOP capabilities too."""

    def create_initialization_options(
        self,
        notification_options: Any = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> Any:
        experimental = {**(experimental_capabilities or {}), "openwop": capabilities()}
        return super().create_initialization_options(notification_options, experimental, extensions)


def build_server(backend: Backend) -> Server[Backend]:
    """The MCP server of ``backend``'s sidecar; transports are the caller's."""

    @asynccontextmanager
    async def lifespan(_: Server[Backend]) -> Any:
        yield backend

    async def list_tools(
        ctx: ServerRequestContext[Backend, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=list(TOOLS.values()))

    async def on_call(
        ctx: ServerRequestContext[Backend, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return await call_tool(_session_of(ctx), params.name, params.arguments)

    server = _MemoryServer(
        "openwop-memory",
        version=__version__,
        instructions="OpenWOP memory: get a memoryRef from memory_scope, then search, list, get, "
        "put and delete entries in it. Each session reads one snapshot of memory.",
        lifespan=lifespan,
        on_list_tools=list_tools,
        on_call_tool=on_call,
    )

    async def on_initialized(
        ctx: ServerRequestContext[Backend, Any], params: types.NotificationParams
    ) -> None:
        # The session's snapshot is taken when it starts, not at its first tool call. A
        # failure here (the sidecar refuses the tenant, or is down) is reported by the first
        # tool call, which begins the run again.
        with contextlib.suppress(OpenWopMemoryError):
            await _session_of(ctx).run()

    async def decline_discover(
        ctx: ServerRequestContext[Backend, Any], params: types.RequestParams
    ) -> Any:
        raise MCPError(code=types.METHOD_NOT_FOUND, message="use the initialize handshake")

    server.add_notification_handler(
        "notifications/initialized", types.NotificationParams, on_initialized
    )
    server.add_request_handler("server/discover", types.RequestParams, decline_discover)
    return server


async def serve_stdio(backend: Backend) -> None:
    """Serve one session over stdin/stdout until the client closes them."""
    from mcp.server.runner import serve_loop
    from mcp.server.stdio import stdio_server

    server = build_server(backend)
    async with stdio_server() as (read_stream, write_stream):
        await serve_loop(
            server,
            read_stream,
            write_stream,
            lifespan_state=backend,
        )


ASGIApp = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]


class BearerAuth:
    """Refuses every HTTP request without ``Authorization: Bearer <token>`` (401)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"www-authenticate", b"Bearer"),
                            (b"content-type", b"application/json"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": b'{"error":"unauthorized"}'})
                return
        await self.app(scope, receive, send)


_LOOPBACK_NAMES = ["127.0.0.1", "localhost", "[::1]"]


def http_app(backend: Backend, *, token: str | None, loopback: bool) -> Any:
    """The streamable HTTP app at ``/mcp`` (behind :class:`BearerAuth` when ``token``).

    On loopback (or a Unix socket) the Host and Origin headers must name a loopback host,
    against DNS rebinding; the SDK's own default wants a port, which a request over a Unix
    socket does not carry. Elsewhere (only ever with a token) the token is the guard.
    """
    from mcp.server.transport_security import TransportSecuritySettings

    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=loopback,
        allowed_hosts=[form for name in _LOOPBACK_NAMES for form in (name, f"{name}:*")],
        allowed_origins=[f"http://{name}{port}" for name in _LOOPBACK_NAMES for port in ("", ":*")],
    )
    server = build_server(backend)
    app = server.streamable_http_app(transport_security=security)
    return BearerAuth(app, token) if token is not None else app


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback name or address (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_unix(path: str) -> socket.socket:
    """A listening Unix socket at ``path`` that only this user may connect to (0600).

    Bound here rather than by uvicorn, which makes its socket 0666: any local user could
    then act as this server's tenant. A stale socket file (nobody listening) is replaced.

    :raises OSError: the path is in use by a live listener, or cannot be bound.
    """
    if os.path.exists(path):
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)
            else:
                raise OSError(errno.EADDRINUSE, f"{path} is in use by a running server")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(old)
    sock.listen(128)
    return sock


async def serve_http(
    backend: Backend,
    *,
    host: str,
    port: int,
    uds: str | None,
    token: str | None,
) -> None:
    """Serve streamable HTTP on ``host:port`` or the Unix socket ``uds`` until cancelled.

    :raises OSError: the address or socket cannot be bound.
    """
    import uvicorn

    loopback = uds is not None or is_loopback(host)
    app = http_app(backend, token=token, loopback=loopback)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    if uds is None:
        await uvicorn.Server(config).serve()
        return
    sock = bind_unix(uds)
    try:
        await uvicorn.Server(config).serve(sockets=[sock])
    finally:
        sock.close()
        with contextlib.suppress(OSError):
            os.unlink(uds)
