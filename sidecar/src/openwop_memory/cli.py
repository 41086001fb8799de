"""``openwop-memory serve``, ``openwop-memory health`` and ``openwop-memory metrics``.

Exit codes: ``serve`` 0 after a graceful stop, 1 when it cannot start (the message says
why), 128+N after a second signal N. ``health`` 0 healthy, 1 degraded, 2 nothing answers.
``metrics`` 0 with the Prometheus page on stdout, 2 nothing answers.

``health`` is a probe run every few seconds by Kubernetes or systemd, so its path imports
only the standard library (the server stack takes most of a second to import).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any

from . import __version__

DEFAULT_SOCKET = "var/openwop-memory.sock"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["health"]:
        health_args = _health_parser().parse_args(args[1:])
        return health(_health_socket(health_args), health_args.timeout)
    if args[:1] in (["inspect"], ["backup"]):
        from . import cli_admin  # the operator's commands: only their own path pays for them

        return cli_admin.main(args)
    if args[:1] == ["metrics"]:
        metrics_args = _health_parser(prog="openwop-memory metrics").parse_args(args[1:])
        return metrics(_health_socket(metrics_args), metrics_args.timeout)
    return _serve_main(args)


def _health_parser(
    parser: argparse.ArgumentParser | None = None, prog: str = "openwop-memory health"
) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog=prog)
    parser.add_argument("--socket", default=None, help="socket path (OPENWOP_MEMORY_SOCKET)")
    parser.add_argument("--config", default=None, help="TOML file to read `socket` from")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait")
    return parser


def _health_socket(args: argparse.Namespace) -> str:
    """The socket path: flag > environment > config file > default, as ``serve`` reads it."""
    if args.socket:
        return str(args.socket)
    if os.environ.get("OPENWOP_MEMORY_SOCKET"):
        return os.environ["OPENWOP_MEMORY_SOCKET"]
    config = args.config or os.environ.get("OPENWOP_MEMORY_CONFIG")
    if config:
        import tomllib  # only here: a probe given no config file never reads TOML

        try:
            with open(config, "rb") as f:
                value = tomllib.load(f).get("socket")
        except (OSError, tomllib.TOMLDecodeError):
            value = None
        if isinstance(value, str) and value:
            return value
    return DEFAULT_SOCKET


def _serve_main(argv: list[str]) -> int:
    import anyio
    import structlog

    from . import server
    from .config import (
        DEPRECATED,
        ConfigError,
        DeprecatedSpelling,
        flag_of,
        load_settings,
        setting_fields,
    )
    from .errors import StartupError
    from .logs import configure_logging

    parser = argparse.ArgumentParser(prog="openwop-memory", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the memory sidecar")
    serve.add_argument("--config", help="TOML file with settings (OPENWOP_MEMORY_CONFIG)")
    for name, field in setting_fields().items():
        default = f"{field.default:04o}" if name == "socket_mode" else field.default
        shown = f"default: {'not set' if default is None else default}"
        # A switch given alone means true (`--access-log`), as it does for uvicorn.
        switch = field.annotation is bool
        serve.add_argument(
            flag_of(name),
            dest=name,
            default=None,
            metavar=name.rpartition(".")[2].upper(),
            help=f"{field.description}; {shown}" if field.description else shown,
            nargs="?" if switch else None,
            const="true" if switch else None,
        )
    for old, new in DEPRECATED.items():
        serve.add_argument(
            flag_of(old), dest=old, default=None, help=f"deprecated: use {flag_of(new)}"
        )
    _health_parser(sub.add_parser("health", help="ask a running sidecar whether it is healthy"))
    _health_parser(sub.add_parser("metrics", help="print a running sidecar's Prometheus metrics"))
    sub.add_parser("inspect", help="what runs saw, scopes, entries (over the admin socket)")
    sub.add_parser("backup", help="a consistent copy of a SQLite database (admin socket)")
    args = parser.parse_args(argv)
    flags = {name: getattr(args, name) for name in [*setting_fields(), *DEPRECATED]}
    deprecations: list[DeprecatedSpelling] = []
    try:
        settings = load_settings(flags, config_file=args.config, deprecations=deprecations)
    except ConfigError as exc:
        print(f"openwop-memory: {exc}", file=sys.stderr)
        return 1
    configure_logging(settings.log_format, settings.log_level)
    for deprecation in deprecations:
        structlog.get_logger("openwop_memory.config").warning(
            "deprecated_setting",
            setting=deprecation.old,
            source=deprecation.source,
            use=deprecation.new,
            message=str(deprecation),
        )
    try:
        # uvloop: markedly less CPU per request than the stock asyncio loop.
        anyio.run(server.serve, settings, backend="asyncio", backend_options={"use_uvloop": True})
    except StartupError as exc:
        print(f"openwop-memory: cannot start: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a SIGINT before the signal handler was installed
        return 130
    return 0


def health(socket_path: str, timeout: float) -> int:
    """Exit status for ``openwop-memory health``: 0 ok, 1 degraded, 2 nothing answers."""
    try:
        result = _ask(socket_path, "sidecar.health", timeout)
        status = result["status"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(
            f"openwop-memory: no healthy answer on {socket_path}: {type(exc).__name__}",
            file=sys.stderr,
        )
        return 2
    print(json.dumps(result))
    return 0 if status == "ok" else 1


def metrics(socket_path: str, timeout: float) -> int:
    """Exit status for ``openwop-memory metrics``: 0 (the page printed), 2 nothing answers."""
    try:
        text = _ask(socket_path, "sidecar.metrics", timeout)["text"]
        if not isinstance(text, str):
            raise TypeError("text")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(
            f"openwop-memory: no metrics from {socket_path}: {type(exc).__name__}", file=sys.stderr
        )
        return 2
    sys.stdout.write(text)
    return 0


def _ask(socket_path: str, method: str, timeout: float) -> Any:
    """The result of one request without params.

    :raises OSError: no connection or no answer in time.
    :raises ValueError: the answer is not JSON.
    :raises KeyError: the answer is an error.
    """
    request = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {}}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(socket_path)
        s.sendall(json.dumps(request).encode() + b"\n")
        with s.makefile("rb") as f:
            return json.loads(f.readline())["result"]


if __name__ == "__main__":
    sys.exit(main())
