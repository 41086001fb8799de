"""``openwop-memory mcp``: parse the command line, open the sidecar client, serve."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

DESCRIPTION = """\
Serve the sidecar's memory as MCP tools (docs/mcp.md). The process is a client of the
sidecar's socket: the sidecar's tenant binding applies to the user who runs it. Each MCP
session reads one snapshot (one OpenWOP run, begun at initialize, ended at close)."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="openwop-memory mcp", description=DESCRIPTION)
    p.add_argument("--socket", help="the sidecar's socket [env: OPENWOP_MEMORY_SOCKET]")
    p.add_argument(
        "--tenant",
        default=os.environ.get("OPENWOP_MEMORY_TENANT"),
        help="the tenant every session's run belongs to [env: OPENWOP_MEMORY_TENANT]",
    )
    p.add_argument(
        "--secrets-file",
        metavar="FILE",
        help="a JSON object secret id -> value, registered for every session",
    )
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio", help="default: stdio")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="HTTP address (loopback unless --auth-token-file); default 127.0.0.1",
    )
    p.add_argument("--port", type=int, default=8765, help="HTTP port; default 8765")
    p.add_argument(
        "--unix-socket", metavar="PATH", help="serve HTTP on this Unix socket instead of a port"
    )
    p.add_argument(
        "--auth-token-file",
        metavar="FILE",
        help="require `Authorization: Bearer <the file's content>`",
    )
    p.add_argument(
        "--capabilities", action="store_true", help="print the OpenWOP capabilities (JSON) and exit"
    )
    return p


def _read_secrets(path: str) -> dict[str, str]:
    """:raises ValueError: the file is not a JSON object of non-empty strings (no value named)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read --secrets-file {path}: {type(exc).__name__}") from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) and v for k, v in data.items()
    ):
        raise ValueError(f"--secrets-file {path} must hold a JSON object of secret id -> value")
    return data


def _read_token(path: str) -> str:
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValueError(f"cannot read --auth-token-file {path}: {type(exc).__name__}") from None
    if len(token) < 16:
        raise ValueError(f"--auth-token-file {path} must hold a token of 16 characters or more")
    return token


def main(argv: Sequence[str]) -> int:
    """Run ``openwop-memory mcp``; 2 for a usage error, 1 when serving failed."""
    args = parser().parse_args(list(argv))
    if importlib.util.find_spec("mcp") is None:
        print(
            "openwop-memory mcp: the MCP SDK is not installed"
            " (the [mcp] extra: pip install './sidecar[mcp]')",
            file=sys.stderr,
        )
        return 2
    from .server import Backend, capabilities, is_loopback, serve_http, serve_stdio

    if args.capabilities:
        print(json.dumps({"capabilities": capabilities()}))
        return 0
    if not args.tenant:
        print(
            "openwop-memory mcp: --tenant (or OPENWOP_MEMORY_TENANT) is required", file=sys.stderr
        )
        return 2
    try:
        secrets = _read_secrets(args.secrets_file) if args.secrets_file else {}
        token = _read_token(args.auth_token_file) if args.auth_token_file else None
    except ValueError as exc:
        print(f"openwop-memory mcp: {exc}", file=sys.stderr)
        return 2
    if (
        args.transport == "http"
        and args.unix_socket is None
        and not is_loopback(args.host)
        and token is None
    ):
        print(
            f"openwop-memory mcp: refusing to serve on {args.host}, not a loopback address,"
            " without --auth-token-file",
            file=sys.stderr,
        )
        return 2

    import anyio
    from openwop_memory_client import AsyncMemoryClient, SidecarUnavailableError

    async def serve() -> None:
        async with AsyncMemoryClient(args.socket) as client:
            backend = Backend(client, args.tenant, secrets)
            if args.transport == "stdio":
                await serve_stdio(backend)
            else:
                await serve_http(
                    backend, host=args.host, port=args.port, uds=args.unix_socket, token=token
                )

    try:
        anyio.run(serve, backend="asyncio")
    except (SidecarUnavailableError, OSError) as exc:
        print(f"openwop-memory mcp: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
