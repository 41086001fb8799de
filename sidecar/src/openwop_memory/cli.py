"""``openwop-memory serve`` and ``openwop-memory health``.

Exit codes: ``serve`` 0 after a graceful stop, 1 when it cannot start (the message says
why), 128+N after a second signal N. ``health`` 0 healthy, 1 degraded, 2 nothing answers.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections.abc import Sequence

import anyio

from . import __version__
from .config import ConfigError, Settings, load_settings
from .logs import configure_logging
from .server import Server, StartupError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="openwop-memory", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the memory sidecar")
    serve.add_argument("--config", help="TOML file with settings (OPENWOP_MEMORY_CONFIG)")
    for name, field in Settings.model_fields.items():
        serve.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            default=None,
            metavar=name.upper(),
            help=f"default: {field.default}",
        )
    health = sub.add_parser("health", help="ask a running sidecar whether it is healthy")
    health.add_argument("--socket", default=None, help="socket path (OPENWOP_MEMORY_SOCKET)")
    health.add_argument("--timeout", type=float, default=5.0, help="seconds to wait")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "health":
        return health(args.socket, args.timeout)
    flags = {name: getattr(args, name) for name in Settings.model_fields}
    try:
        settings = load_settings(flags, config_file=args.config)
    except ConfigError as exc:
        print(f"openwop-memory: {exc}", file=sys.stderr)
        return 1
    configure_logging(settings.log_format, settings.log_level)
    try:
        anyio.run(Server(settings).serve, backend="asyncio")
    except StartupError as exc:
        print(f"openwop-memory: cannot start: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a SIGINT before the signal handler was installed
        return 130
    return 0


def health(socket_path: str | None, timeout: float) -> int:
    """Exit status for ``openwop-memory health``: 0 ok, 1 degraded, 2 nothing answers."""
    import os

    path = socket_path or os.environ.get("OPENWOP_MEMORY_SOCKET", "var/openwop-memory.sock")
    request = {"jsonrpc": "2.0", "id": 1, "method": "sidecar.health", "params": {}}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(json.dumps(request).encode() + b"\n")
            with s.makefile("rb") as f:
                answer = json.loads(f.readline())
        status = answer["result"]["status"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"openwop-memory: no healthy answer on {path}: {type(exc).__name__}", file=sys.stderr)
        return 2
    print(json.dumps(answer["result"]))
    return 0 if status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
