"""``openwop-memory export FILE`` and ``openwop-memory import FILE``: a whole memory as NDJSON
(see :mod:`openwop_memory.transfer`), to move it between databases, SQLite and PostgreSQL.

They open the database themselves, as ``serve`` would (``--database``, else
``OPENWOP_MEMORY_DATABASE``, else ``database`` of the TOML file given by ``--config`` or
``OPENWOP_MEMORY_CONFIG``), so they need no running sidecar and no socket. An export reads
beside running sidecars; it never creates a database. An import goes into a database no
sidecar serves (a sidecar reads the memoryRef key once, at its start): it holds the
database's serve lock exclusive, so it is refused while one does; one that fails removes
the SQLite database it created (never one that was there). It applies to
each entry what a put into it applies, under the same settings (``secrets_dir``,
``redaction``, ``credential_patterns``, ``max_entry_size_bytes``, from the same sources).
A ``memory://`` database is refused: it lives in the process that serves it, which these
commands, in a process of their own, cannot reach.

Exit codes: 0 done, 1 it could not (the message says why).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the command's path imports the rest once its arguments are read
    from ..config import Settings
    from ..service.transfer import Imported, ImportRules
    from ..storage.base import Storage

_EPILOG = """\
The database is --database, else OPENWOP_MEMORY_DATABASE, else the database key of the
TOML file given by --config or OPENWOP_MEMORY_CONFIG, as for `openwop-memory serve`.
The file holds every tenant's memory (redacted as stored) and the key memoryRefs are
signed with: it is created 0600; keep it as you keep the database.

exit codes:
  0  done
  1  it could not be done (the message says why)
"""


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    import anyio

    from ..config import ConfigError, load_settings
    from ..logs import configure_logging

    flags: dict[str, object] = {"database": args.database}
    if args.command == "export":
        flags["create_database"] = False  # reading a database never makes one
    try:
        settings = load_settings(flags, config_file=args.config)
    except ConfigError as exc:
        print(f"openwop-memory: {exc}", file=sys.stderr)
        return 1
    configure_logging(settings.log_format, "warning")
    try:
        message = anyio.run(_run, args, settings, backend="asyncio")
    except _Failed as exc:
        print(f"openwop-memory: {args.command} failed: {exc}", file=sys.stderr)
        return 1
    print(message)
    return 0


class _Failed(Exception):
    pass


async def _run(args: argparse.Namespace, settings: Settings) -> str:
    from openwop_memory_client import MemoryServiceError

    from ..service.transfer import TransferError
    from ..storage.base import StorageStartupError
    from ..storage.registry import create_storage, scheme_of

    if scheme_of(settings.database) == "memory":
        # This command runs in a process of its own: it would read or fill an empty
        # database of its own, which goes when it exits.
        raise _Failed(
            "a memory:// database lives only in the process that serves it; "
            f"{args.command} cannot reach it from another"
        )
    try:
        storage = create_storage(settings.database, settings, create=settings.create_database)
    except StorageStartupError as exc:
        raise _Failed(str(exc)) from None
    if args.command == "export":
        try:
            await storage.open()
        except StorageStartupError as exc:
            raise _Failed(str(exc)) from None
        try:
            return await _export(storage, args.file)
        except MemoryServiceError as exc:
            raise _Failed(f"{exc.code}: {exc.message}") from None
        finally:
            await storage.close()
    # No sidecar may serve it meanwhile: one keeps the ref key it read at its start.
    storage.lock_at_open(exclusive=True)
    try:
        done = await _import(storage, args.file, settings)
    except BaseException as exc:
        # A database this import created goes with it, so a later `serve
        # --create-database false` does not take an empty file for the memory.
        await storage.discard()
        if isinstance(exc, StorageStartupError | TransferError):
            raise _Failed(str(exc)) from None
        if isinstance(exc, MemoryServiceError):
            raise _Failed(f"{exc.code}: {exc.message}") from None
        raise
    await storage.close()
    return (
        f"imported {done.entries} entries from {args.file} ({done.skipped} already there) "
        f"in {done.seconds} s; {done.redactions} secrets redacted, {done.clamped} "
        "createdAt in the future set to the import's time"
    )


async def _import(storage: Storage, path: str, settings: Settings) -> Imported:
    """Open ``storage`` (under its exclusive lock) and import the file ``path`` into it.

    :raises StorageStartupError: the database cannot be opened, or a sidecar serves it.
    :raises TransferError: see :func:`~openwop_memory.transfer.import_from`.
    :raises _Failed: the file or the secrets cannot be read.
    """
    from ..service.embedding import EmbeddingModel
    from ..service.transfer import import_from

    await storage.open()
    rules = await _import_rules(settings)
    try:
        with open(path, "rb") as source:  # noqa: ASYNC230 - a local file, in lines
            embedding = EmbeddingModel(
                enabled=settings.semantic_search, model=settings.embedding_model
            )
            return await import_from(storage, source, rules, embedding)
    except OSError as exc:
        raise _Failed(f"cannot read {path}: {exc.strerror}") from None


async def _import_rules(settings: Settings) -> ImportRules:
    """What a put under ``settings`` applies, with ``secrets_dir``'s secrets loaded."""
    from ..app import load_secrets_directory
    from ..errors import StartupError
    from ..service.transfer import ImportRules

    try:
        host = await load_secrets_directory(settings)
    except StartupError as exc:
        raise _Failed(str(exc)) from None
    return ImportRules(
        max_entry_size_bytes=settings.max_entry_size_bytes,
        redaction=settings.redaction,
        credential_patterns=settings.credential_patterns,
        host_secrets=host,
        max_keyring_memory_bytes=settings.max_keyring_memory_bytes,
    )


async def _export(storage: Storage, path: str) -> str:
    from ..service.transfer import export_to

    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise _Failed(f"cannot create {path}: {exc.strerror} (it must be a new file)") from None
    try:
        with os.fdopen(fd, "wb") as out:
            done = await export_to(storage, out)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(path)
        if isinstance(exc, OSError):  # the disk full, a file size limit: one line, not a trace
            raise _Failed(f"cannot write {path}: {exc.strerror}") from None
        raise
    return (
        f"exported {done.entries} entries of {done.tenants} tenants to {path} in {done.seconds} s"
    )


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--database",
        metavar="URL",
        help="the database, as for serve [env: OPENWOP_MEMORY_DATABASE; default: see below]",
    )
    common.add_argument(
        "--config",
        metavar="FILE",
        help="TOML file of serve's settings to read database from [env: OPENWOP_MEMORY_CONFIG]",
    )
    parser = argparse.ArgumentParser(prog="openwop-memory")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text, file_help in (
        (
            "export",
            "write every live entry, with its scope, and the ref key to a new NDJSON file",
            "the new file",
        ),
        (
            "import",
            "store an export's entries in a new database, which takes over its ref key",
            "a file written by export",
        ),
    ):
        command = sub.add_parser(
            name,
            parents=[common],
            help=text,
            description=text[0].upper() + text[1:] + ".",
            epilog=_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_argument("file", help=file_help)
    return parser
