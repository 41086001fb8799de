"""``openwop-memory inspect``, ``backup`` and ``forget``: the operator's commands, sent over
the admin socket (see :mod:`openwop_memory.wire.admin`).

``inspect runs`` | ``inspect run RUN_ID`` | ``inspect diff FROM_RUN TO_RUN`` |
``inspect scopes TENANT`` | ``inspect entry ID`` print a table (``--json``: the answer as
it came). What they print from stored data can hold anything a worker wrote: control
characters (C0, DEL, C1) are printed escaped
(``\\x1b``, ``\\r``, ``\\x9b``; in ``--json``, as ``\\u`` escapes), so no entry can move
the cursor, retitle or clear the operator's terminal, or fake a line of the table.
``backup DEST`` writes a consistent, checked copy of a running SQLite database to the new
file DEST (an absolute path, written by the sidecar's user) and says how long it took.
``forget TENANT SUBJECT`` removes for good every entry of TENANT tagged
``subject:SUBJECT`` and says how many went.

The admin socket is ``--admin-socket``, else ``OPENWOP_MEMORY_ADMIN_SOCKET``, else the
``admin_socket`` of the TOML file given by ``--config`` or ``OPENWOP_MEMORY_CONFIG``, else
of the installed config file if it exists (as ``health`` finds its socket).
Exit codes: 0 done, 1 the sidecar answered with an error (printed), or the backup it
reported is not there from this command's side, 2 nothing answered.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from ..backup_check import backup_unseen
from .rpc import INSTALLED_CONFIG, ConfigFileError, answer_to, socket_setting

_CONTENT_WIDTH = 60

# Every character a terminal may act on: C0 (tab and newline included: in a cell they would
# break the layout), DEL and C1 (U+009B is a one-character CSI).
_CONTROLS = [*range(0x20), *range(0x7F, 0xA0)]
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPED = {c: _NAMED.get(chr(c), f"\\x{c:02x}") for c in _CONTROLS}
# json.dumps escapes C0 but not DEL or C1 (with ensure_ascii off).
_JSON_UNSAFE = re.compile(r"[\x7f-\x9f]")


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        path = _admin_socket(args)
    except ConfigFileError as exc:
        print(f"openwop-memory: {exc}", file=sys.stderr)
        return 2
    if path is None:
        print(
            "openwop-memory: no admin socket: pass --admin-socket PATH, or set admin_socket "
            "in the sidecar's configuration (the sidecar must be started with it)",
            file=sys.stderr,
        )
        return 2
    method, params = _request(args)
    try:
        answer = answer_to(path, method, args.timeout, params)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        print(f"openwop-memory: no answer on the admin socket {path}: {reason}", file=sys.stderr)
        return 2
    if "error" in answer:
        data = answer["error"].get("data") or {}
        error = f"{data.get('error', 'error')}: {data.get('message', '')}"
        print(f"openwop-memory: {escape(error)}", file=sys.stderr)
        return 1
    result = answer["result"]
    if args.command == "backup":
        unseen = backup_unseen(result, path)
        if unseen:
            print(f"openwop-memory: {unseen}", file=sys.stderr)
            return 1
    if args.json:
        text = json.dumps(result, ensure_ascii=False, indent=2)
        print(_JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text))
    else:
        print(_render(args, _escaped(result)))
    return 0


def escape(text: str) -> str:
    """``text`` with every control character written as an escape (``\\x1b``, ``\\r``):
    printable on a terminal as it is, whatever a worker stored."""
    return text.translate(_ESCAPED)


def _escaped(value: Any) -> Any:
    """``value`` (a JSON answer) with every string in it, keys included, :func:`escape`d."""
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, list):
        return [_escaped(v) for v in value]
    if isinstance(value, dict):
        return {escape(k): _escaped(v) for k, v in value.items()}
    return value


_EPILOG = f"""\
The admin socket is looked for in this order: --admin-socket, OPENWOP_MEMORY_ADMIN_SOCKET,
the admin_socket of the TOML file given by --config or OPENWOP_MEMORY_CONFIG, the
admin_socket of {INSTALLED_CONFIG} if it exists. The sidecar must have been started
with admin_socket set.

exit codes:
  0  done
  1  the sidecar answered with an error (printed on stderr), or backup: the file the
     sidecar reports is not there, or not of its size, from this command's side
  2  nothing answered, no admin socket is known, or the config file cannot be read
"""


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--admin-socket",
        metavar="PATH",
        help="the sidecar's admin socket [env: OPENWOP_MEMORY_ADMIN_SOCKET; default: see below]",
    )
    common.add_argument(
        "--config",
        metavar="FILE",
        help="TOML file to read admin_socket from; an error if it cannot be read "
        f"[env: OPENWOP_MEMORY_CONFIG; default: {INSTALLED_CONFIG} if it exists]",
    )
    common.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait for the answer [default: 60s]",
    )
    common.add_argument("--json", action="store_true", help="print the answer as JSON")

    def command(
        parent: argparse._SubParsersAction[argparse.ArgumentParser], name: str, text: str
    ) -> argparse.ArgumentParser:
        return parent.add_parser(
            name,
            parents=[common],
            help=text,
            description=text[0].upper() + text[1:] + ".",
            epilog=_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    parser = argparse.ArgumentParser(prog="openwop-memory")
    sub = parser.add_subparsers(dest="command", required=True)
    inspect = sub.add_parser("inspect", help="what runs saw, scopes, entries")
    what = inspect.add_subparsers(dest="what", required=True)
    runs = command(what, "runs", "stored runs, the most recently touched first")
    runs.add_argument(
        "--limit", type=int, default=100, metavar="N", help="at most N runs [default: 100]"
    )
    command(what, "run", "what a run's snapshot sees, scope by scope").add_argument("run_id")
    diff = command(what, "diff", "what changed between two runs' snapshots (one tenant)")
    diff.add_argument("from_run", help="a run id (the earlier of the two is shown as from)")
    diff.add_argument("to_run", help="another run id of the same tenant")
    command(what, "scopes", "a tenant's scopes and their live entries").add_argument("tenant")
    command(what, "entry", "one entry by id, whatever its tenant").add_argument("entry_id")
    backup = command(sub, "backup", "a consistent, checked copy of a running SQLite database")
    backup.add_argument("dest", help="the new file: a path on the sidecar's host")
    forget = command(
        sub,
        "forget",
        "remove for good every entry of a tenant tagged subject:SUBJECT, in all its scopes "
        "(runs that saw them stop seeing them)",
    )
    forget.add_argument("tenant")
    forget.add_argument("subject", help="the subject's id: entries tagged subject:SUBJECT go")
    return parser


def _admin_socket(args: argparse.Namespace) -> str | None:
    """:raises ConfigFileError: the config file named (or installed) is unusable."""
    return socket_setting(
        args.admin_socket, "OPENWOP_MEMORY_ADMIN_SOCKET", args.config, "admin_socket", default=None
    )


def _request(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    if args.command == "backup":
        return "admin.backup", {"path": os.path.abspath(args.dest)}
    if args.command == "forget":
        return "admin.forget", {"tenant": args.tenant, "subject": args.subject}
    if args.what == "runs":
        return "admin.runs", {"limit": args.limit}
    if args.what == "run":
        return "admin.run", {"runId": args.run_id}
    if args.what == "diff":
        return "admin.diff", {"from": args.from_run, "to": args.to_run}
    if args.what == "scopes":
        return "admin.scopes", {"tenant": args.tenant}
    return "admin.entry", {"id": args.entry_id}


def _render(args: argparse.Namespace, result: Any) -> str:
    if args.command == "backup":
        return f"backed up {result['bytes']} bytes to {result['path']} in {result['seconds']} s"
    if args.command == "forget":
        return (
            f"forgot {result['forgotten']} entries of subject {result['subject']} "
            f"in tenant {result['tenant']} in {result['seconds']} s"
        )
    if args.what == "runs":
        columns = ("runId", "tenant", "snapshotAt", "touchedAt", "retained", "openHere")
        return _table(columns, result)
    if args.what == "scopes":
        return _table(("scope", "liveEntries"), result)
    if args.what == "diff":
        return _diff(result)
    if args.what == "entry":
        entry = result["entry"]
        head = f"tenant {result['tenant']}  scope {result['scope']}"
        head += "  (deleted)" if result["deleted"] else ""
        return head + "\n" + _entries([entry])
    lines = [f"run {result['runId']}  tenant {result['tenant']}  snapshot {result['snapshotAt']}"]
    if not result["scopes"]:
        lines.append("(sees no entries)")
    for scope in result["scopes"]:
        lines.append(f"\nscope {scope['scope']}  ({len(scope['entries'])} entries)")
        lines.append(_entries(scope["entries"]))
    return "\n".join(lines)


def _diff(result: dict[str, Any]) -> str:
    old, new = result["from"], result["to"]
    lines = [
        f"tenant {result['tenant']}  from run {old['runId']} ({old['snapshotAt']})"
        f"  to run {new['runId']} ({new['snapshotAt']})"
    ]
    if not result["scopes"]:
        lines.append("(no change)")
    for scope in result["scopes"]:
        counts = ", ".join(f"{len(scope[k])} {k}" for k in ("added", "superseded", "deleted"))
        more = "  (compared on the newest entries only)" if scope["truncated"] else ""
        lines.append(f"\nscope {scope['scope']}  ({counts}){more}")
        rows = [{"change": "added", **e} for e in scope["added"]]
        rows += [{"change": f"superseded by {s['by']}", **s["entry"]} for s in scope["superseded"]]
        rows += [{"change": "deleted", **e} for e in scope["deleted"]]
        lines.append(_entries(rows, with_change=True))
    return "\n".join(lines)


def _entries(entries: list[dict[str, Any]], *, with_change: bool = False) -> str:
    rows = [
        {
            "id": e["id"],
            "createdAt": e["createdAt"],
            "expiresAt": e.get("expiresAt", ""),
            "tags": ",".join(e.get("tags", [])),
            "content": _cut(e["content"]),
            "change": e.get("change", ""),
        }
        for e in entries
    ]
    columns = ("id", "createdAt", "expiresAt", "tags", "content")
    return _table(("change", *columns) if with_change else columns, rows)


def _cut(text: str) -> str:
    """``text`` (escaped already: one line) cut to the content column's width."""
    return text if len(text) <= _CONTENT_WIDTH else text[: _CONTENT_WIDTH - 1] + "…"


def _table(columns: Sequence[str], rows: list[dict[str, Any]]) -> str:
    cells = [[str(row.get(c, "")) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)
