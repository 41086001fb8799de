"""``openwop-memory serve``, ``openwop-memory health`` and ``openwop-memory metrics``.

Exit codes: ``serve`` 0 after a graceful stop, 1 when it cannot start (the message says
why), 128+N after a second signal N. ``health`` 0 healthy, 1 degraded, 2 nothing answers.
``metrics`` 0 with the Prometheus page on stdout, 2 nothing answers.

``health`` is a probe run every few seconds by Kubernetes or systemd, so its path imports
only the standard library (the server stack takes most of a second to import).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from .. import __version__
from .rpc import (
    DEFAULT_SOCKET,
    INSTALLED_CONFIG,
    MAX_SOCKET_PATH_BYTES,
    PERMISSION_HINT,
    ConfigFileError,
    ErrorAnswer,
    ask,
    socket_setting,
)

DESCRIPTION = (
    "The openwop-memory sidecar: OpenWOP run memory (RFC 0004) served as JSON-RPC 2.0 "
    "over a Unix socket."
)
EPILOG = """\
`openwop-memory serve --help` lists every setting, `openwop-memory health --help` the
exit codes of the probe.

Settings are read from flags, then OPENWOP_MEMORY_* environment variables, then the TOML
file named by --config or OPENWOP_MEMORY_CONFIG, then the defaults. Durations are seconds
or a number with a unit: 500ms, 60s, 5m, 2h, 7d.
"""
HEALTH_EPILOG = f"""\
exit codes:
  0  the sidecar answered ok (its answer is printed as JSON)
  1  the sidecar answered degraded (the database is failing; see storage.problems)
  2  no answer: no socket, no permission, no answer within --timeout, or an unreadable
     config file

the socket, first found of:
  --socket; OPENWOP_MEMORY_SOCKET; the `socket` key of the file named by --config or
  OPENWOP_MEMORY_CONFIG; the `socket` key of {INSTALLED_CONFIG}
  (the file `serve` reads when installed by systemd/) if it exists; else
  {DEFAULT_SOCKET}, relative to the current directory.
"""
METRICS_EPILOG = f"""\
exit codes:
  0  the metrics page was printed (Prometheus text format)
  2  no answer: no socket, no permission, no answer within --timeout, or an unreadable
     config file

the socket is found as for `openwop-memory health`: --socket; OPENWOP_MEMORY_SOCKET; the
`socket` key of --config, OPENWOP_MEMORY_CONFIG or {INSTALLED_CONFIG}; else
{DEFAULT_SOCKET}.
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["help"]:
        # `openwop-memory help [COMMAND]`, as git and pip spell it: COMMAND's --help.
        args = [*args[1:2], "--help"]
    if args[:1] == ["health"]:
        health_args = _health_parser().parse_args(args[1:])
        try:
            path = _health_socket(health_args)
        except ConfigFileError as exc:
            print(f"openwop-memory: {exc}", file=sys.stderr)
            return 2
        return health(path, health_args.timeout)
    if args[:1] in (["inspect"], ["backup"], ["forget"]):
        from . import (
            admin as cli_admin,  # the operator's commands: only their own path pays for them
        )

        return cli_admin.main(args)
    if args[:1] in (["export"], ["import"]):
        from . import transfer as cli_transfer  # opens the database itself: no socket, no sidecar

        return cli_transfer.main(args)
    if args[:1] == ["mcp"]:
        return _mcp_main(args[1:])
    if args[:1] == ["metrics"]:
        metrics_args = _health_parser(prog="openwop-memory metrics").parse_args(args[1:])
        try:
            path = _health_socket(metrics_args)
        except ConfigFileError as exc:
            print(f"openwop-memory: {exc}", file=sys.stderr)
            return 2
        return metrics(path, metrics_args.timeout)
    return _serve_main(args)


def _mcp_main(argv: list[str]) -> int:
    """``openwop-memory mcp``: the MCP server (the ``[mcp]`` extra), a process of its own."""
    from ..mcp_server import cli as mcp_cli  # only this command imports it (never `serve`)

    return mcp_cli.main(argv)


def _health_parser(
    parser: argparse.ArgumentParser | None = None, prog: str = "openwop-memory health"
) -> argparse.ArgumentParser:
    """The options of ``health`` (and of ``metrics``, which finds the socket the same way)."""
    parser = parser or argparse.ArgumentParser(prog=prog)
    if prog.endswith("metrics"):
        parser.description = "Print a running sidecar's Prometheus metrics (sidecar.metrics)."
        parser.epilog = METRICS_EPILOG
    else:
        parser.description = "Ask a running sidecar for sidecar.health and exit by its answer."
        parser.epilog = HEALTH_EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--socket",
        default=None,
        metavar="PATH",
        help="the sidecar's socket [env: OPENWOP_MEMORY_SOCKET; default: see below]",
    )
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="TOML file to read `socket` from; an error if it cannot be read "
        f"[env: OPENWOP_MEMORY_CONFIG; default: {INSTALLED_CONFIG} if it exists]",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how long to wait for the answer [default: 5s]",
    )
    return parser


def _health_socket(args: argparse.Namespace) -> str:
    """The socket path, found as the health epilog says (the order ``serve`` reads it in).

    :raises ConfigFileError: as :func:`socket_setting`.
    """
    found = socket_setting(
        args.socket, "OPENWOP_MEMORY_SOCKET", args.config, "socket", default=DEFAULT_SOCKET
    )
    assert found is not None  # a default was given
    return found


def _serve_main(argv: list[str]) -> int:
    import anyio
    import structlog

    from .. import server
    from ..config import (
        DEPRECATED,
        ConfigError,
        DeprecatedSpelling,
        env_of,
        flag_of,
        load_settings,
        setting_fields,
    )
    from ..errors import StartupError
    from ..logs import configure_logging

    parser = argparse.ArgumentParser(
        prog="openwop-memory",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="{serve,health,metrics,inspect,backup,forget,export,import,mcp,help}",
        title="commands",
    )
    serve = sub.add_parser(
        "serve",
        help="run the sidecar",
        description="Run the sidecar until SIGTERM or SIGINT. Exit codes: 0 after a "
        "graceful stop, 1 when it cannot start (the message says why), 128+N when a "
        "second signal N stopped it at once. Each flag's environment variable and TOML "
        "key are named after it: --max-request-bytes is OPENWOP_MEMORY_MAX_REQUEST_BYTES "
        "and max_request_bytes; --sqlite-busy-timeout is OPENWOP_MEMORY_SQLITE_BUSY_TIMEOUT "
        "and busy_timeout in [sqlite].",
    )
    serve.add_argument(
        "--config",
        metavar="FILE",
        help="TOML file with settings; flags and environment variables override it "
        "[env: OPENWOP_MEMORY_CONFIG; default: none]",
    )
    for name, field in setting_fields().items():
        # A switch given alone means true (`--access-log`), as it does for uvicorn.
        switch = field.annotation is bool
        serve.add_argument(
            flag_of(name),
            dest=name,
            default=None,
            metavar=_metavar(name, field),
            help=_flag_help(name, field),
            nargs="?" if switch else None,
            const="true" if switch else None,
        )
    for old, new in DEPRECATED.items():
        serve.add_argument(
            flag_of(old),
            dest=old,
            default=None,
            metavar=_metavar(new, setting_fields()[new]),
            help=f"deprecated spelling of {flag_of(new)} [env: {env_of(old)}]",
        )
    _health_parser(
        sub.add_parser("health", help="ask a running sidecar whether it is healthy (exit 0/1/2)")
    )
    _health_parser(
        sub.add_parser("metrics", help="print a running sidecar's Prometheus metrics"),
        prog="openwop-memory metrics",
    )
    sub.add_parser("inspect", help="what runs saw, scopes, entries (over the admin socket)")
    sub.add_parser("backup", help="a consistent copy of a SQLite database (admin socket)")
    sub.add_parser("forget", help="remove a subject's entries from a tenant (admin socket)")
    sub.add_parser("export", help="write the whole memory to an NDJSON file (opens the database)")
    sub.add_parser("import", help="load an export into a new database (opens the database)")
    sub.add_parser("mcp", help="serve the memory as MCP tools (the [mcp] extra; docs/mcp.md)")
    sub.add_parser("help", help="this help; `help COMMAND`: the command's")
    args = parser.parse_args(argv)
    flags = {name: getattr(args, name) for name in [*setting_fields(), *DEPRECATED]}
    deprecations: list[DeprecatedSpelling] = []
    try:
        settings = load_settings(flags, config_file=args.config, deprecations=deprecations)
    except ConfigError as exc:
        print(f"openwop-memory: {exc}", file=sys.stderr)
        return 1
    too_long = _socket_path_problem(settings.socket)
    if too_long:
        print(f"openwop-memory: cannot start: {too_long}", file=sys.stderr)
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
    new_database = _new_sqlite_file(settings.database)
    try:
        # uvloop: markedly less CPU per request than the stock asyncio loop.
        anyio.run(server.serve, settings, backend="asyncio", backend_options={"use_uvloop": True})
    except StartupError as exc:
        if new_database is not None:
            _remove_database(new_database)
        print(f"openwop-memory: cannot start: {startup_message(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a SIGINT before the signal handler was installed
        return 130
    return 0


def _metavar(name: str, field: Any) -> str:
    from ..config import choices_of, is_duration

    choices = choices_of(field)
    if choices:
        return "{" + ",".join(choices) + "}"
    if field.annotation is bool:
        return "BOOL"
    if is_duration(field):
        return "DURATION"
    special = {"socket": "PATH", "admin_socket": "PATH", "secrets_dir": "DIR", "database": "URL"}
    special |= {"socket_mode": "MODE", "tenant_binding": "JSON", "metrics_address": "HOST:PORT"}
    if name in special:
        return special[name]
    return "N" if field.annotation is int else name.rpartition(".")[2].upper()


def _flag_help(name: str, field: Any) -> str:
    """``description [env: OPENWOP_MEMORY_X; default: 7d]``, in the units users write."""
    from ..config import env_of, shown_default

    # argparse expands %-formats in help text; a description may hold a literal one.
    description = (field.description or name).replace("%", "%%")
    return f"{description} [env: {env_of(name)}; default: {shown_default(name, field)}]"


def startup_message(exc: Exception) -> str:
    """The one line after ``cannot start:``, with a hint for a permission problem."""
    message = str(exc)
    # The operating system's EACCES (strerror "Permission denied"), not PostgreSQL's
    # lower-case "permission denied for schema", which the database's own hint covers.
    if "Permission denied" in message:
        message += f" ({PERMISSION_HINT})"
    return message


def _socket_path_problem(path: str) -> str:
    """Why ``path`` cannot be a Unix socket's path (too long), or ``""``."""
    size = len(os.fsencode(path))
    if size <= MAX_SOCKET_PATH_BYTES:
        return ""
    return (
        f"the socket path {path} is {size} bytes; a Unix socket path is limited to "
        f"{MAX_SOCKET_PATH_BYTES} bytes: choose a shorter --socket (a relative path counts "
        "from the working directory)"
    )


def _new_sqlite_file(database: str) -> str | None:
    """The SQLite file ``database`` names if it does not exist yet (a failed start removes
    what it created), else ``None``."""
    if not database.startswith("sqlite://"):
        return None
    from ..storage.sqlite.factory import sqlite_path

    path = sqlite_path(database)
    return None if os.path.exists(path) else path


def _remove_database(path: str) -> None:
    # SQLite's companions too: a WAL database leaves -wal and -shm beside the file.
    # Best effort: a path that never became a file (its directory could not be made)
    # fails here too, and the start's own error is the one to report.
    for name in (path, f"{path}-wal", f"{path}-shm", f"{path}-journal"):
        with contextlib.suppress(OSError):
            os.unlink(name)


def health(socket_path: str, timeout: float) -> int:
    """Exit status for ``openwop-memory health``: 0 ok, 1 degraded, 2 nothing answers."""
    try:
        result = ask(socket_path, "sidecar.health", timeout)
        status = result["status"]
    except (OSError, ValueError, KeyError, TypeError, ErrorAnswer) as exc:
        reason = _no_answer_reason(exc, socket_path)
        print(f"openwop-memory: no healthy answer on {socket_path}: {reason}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0 if status == "ok" else 1


def metrics(socket_path: str, timeout: float) -> int:
    """Exit status for ``openwop-memory metrics``: 0 (the page printed), 2 nothing answers."""
    try:
        text = ask(socket_path, "sidecar.metrics", timeout)["text"]
        if not isinstance(text, str):
            raise TypeError("text")
    except (OSError, ValueError, KeyError, TypeError, ErrorAnswer) as exc:
        reason = _no_answer_reason(exc, socket_path)
        print(f"openwop-memory: no metrics from {socket_path}: {reason}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


def _no_answer_reason(exc: Exception, socket_path: str) -> str:
    """Why a probe got no answer, in words, with a hint where one helps."""
    size = len(os.fsencode(socket_path))
    if isinstance(exc, OSError) and size > MAX_SOCKET_PATH_BYTES:
        # The socket module's own error ("AF_UNIX path too long") has no strerror.
        return (
            f"the path is {size} bytes; a Unix socket path is limited to "
            f"{MAX_SOCKET_PATH_BYTES} bytes"
        )
    if isinstance(exc, ErrorAnswer):
        return str(exc)
    reason: str = getattr(exc, "strerror", None) or type(exc).__name__
    if isinstance(exc, PermissionError):
        reason += f" ({PERMISSION_HINT})"
    return reason
