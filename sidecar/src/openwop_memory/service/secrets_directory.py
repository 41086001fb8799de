"""The secrets directory: host secrets the operator keeps in files (setting ``secrets_dir``).

Layout, one file per secret, named by its secret id and holding its value::

    DIR/<secretId>                    host-wide: redacted from every tenant's entries
    DIR/tenants/<tenant>/<secretId>   redacted from that tenant's entries only

Names starting with ``.`` are skipped, so a Kubernetes Secret volume works as it is: its
``..data`` link and timestamped directories are skipped, the normal-named symlinks into
them are followed. A value is the file's UTF-8 text with one trailing newline removed.

Every file that cannot serve as a secret is ignored with a ``host_secret_ignored`` warning
naming the file and the reason. No log line, error or exception raised here ever carries a
secret value or any part of one.

Permissions are checked as the database file's are, on the directories listed (the
directory, ``tenants`` and each tenant's) and on each secret file (the target of a
symlink): writable by the group is a ``host_secrets_writable_by_group`` warning;
writable by every user refuses the whole load (:class:`UnsafeSecretsError`), since any
local user could then plant a "secret" (a symlink to a file only the service may read makes
redaction an oracle on that file). A sidecar does not start on such a directory; a reload
keeps the secrets loaded before and logs ``host_secrets_refused`` as an error naming the
path. On a read-only file system (a Kubernetes Secret volume) nothing can be planted, so no
mode there is refused.

Loads build new mappings and swap them in with one assignment, so :meth:`values_for` can be
called from the event loop while a worker thread reloads.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import anyio
import anyio.abc
import anyio.to_thread
import structlog
from openwop_memory_client.wire import (
    CONTROL_FREE,
    MAX_NAME_CHARS,
    MIN_SECRET_CHARS,
    SECRET_ID_FREE,
)

MAX_SECRET_FILE_BYTES = 16 * 1024
MAX_SECRETS_PER_SCOPE = 256
TENANTS_DIR = "tenants"

# The wire's own rules for ids and tenant names: ids end up inside [REDACTED:<id>].
_SECRET_ID = re.compile(SECRET_ID_FREE)
_TENANT = re.compile(CONTROL_FREE)

log = structlog.get_logger("openwop_memory.secrets_directory")

# (path relative to the directory, inode, size, mtime_ns, mode) of everything a load reads
# (the mode, so that fixing a refused one with chmod is noticed); None when the directory
# does not exist.
Signature = tuple[tuple[str, int, int, int, int], ...] | None


class _Ignored(Exception):
    """A file that cannot serve as a secret; the message is the reason (never the value)."""


class UnsafeSecretsError(PermissionError):
    """A directory or secret file of ``secrets_dir`` is writable by every user: nothing of
    the load is used. ``strerror`` names the path and its mode (never content)."""

    def __init__(self, path: Path, mode: int) -> None:
        super().__init__(
            errno.EPERM,
            f"{path} is writable by every user (mode {mode:04o}); chmod o-w it",
        )
        self.path = path
        self.mode = mode


@dataclass(frozen=True)
class _Loaded:
    """What one load found: value → id, host-wide and per tenant (tenant's own only)."""

    host: Mapping[str, str] = field(default_factory=dict)
    tenants: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return len(self.host) + sum(len(own) for own in self.tenants.values())


@dataclass(frozen=True)
class _State:
    """One generation of the secrets, with each tenant's merged mapping precomputed."""

    generation: int
    loaded: _Loaded
    host: Mapping[str, str]
    by_tenant: Mapping[str, Mapping[str, str]]

    @classmethod
    def build(cls, generation: int, loaded: _Loaded) -> _State:
        host = MappingProxyType(dict(loaded.host))
        # The tenant's id wins when a value is both host-wide and the tenant's own.
        by_tenant = {
            tenant: MappingProxyType({**loaded.host, **own})
            for tenant, own in loaded.tenants.items()
        }
        return cls(generation, loaded, host, by_tenant)


class SecretsDirectory:
    """Host-wide and per-tenant secrets read from ``directory``; a ``HostSecrets``.

    Nothing is read until :meth:`reload` (or :meth:`watch`) runs; until then it holds no
    secrets and :attr:`generation` is 0.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._state = _State.build(0, _Loaded())
        self._lock = threading.Lock()  # one load at a time (SIGHUP and poll may overlap)
        self._signature: Signature = None
        self._scanned = False
        self._reloads: Counter[str] = Counter()

    @property
    def reloads(self) -> Mapping[str, int]:
        """Reloads after the first load (SIGHUP, or a change the poll saw), by outcome:
        ``changed``, ``unchanged`` or ``failed``."""
        return self._reloads

    @property
    def generation(self) -> int:
        """0 before the first load; grows by one with every load that changed the secrets."""
        return self._state.generation

    def values_for(self, tenant: str) -> Mapping[str, str]:
        """Value → secret id for ``tenant``'s runs: its own secrets and the host-wide ones.

        The mapping is immutable and precomputed at load time, so this is a dict lookup.
        """
        state = self._state
        return state.by_tenant.get(tenant, state.host)

    def reload(self) -> bool:
        """Read the directory now (blocking: call it from a worker thread on a loop).

        A missing directory loads as no secrets, with a warning.

        :returns: whether the loaded secrets differ from the previous ones.
        :raises OSError: the directory exists but cannot be listed (or is not a directory);
            the secrets loaded before stay in force.
        """
        with self._lock:
            # Stat before reading: a file changed during the read shows in the next poll.
            signature = _signature(self.directory)
            changed = self._load()
            self._signature, self._scanned = signature, True
            return changed

    async def reload_now(self, trigger: str) -> bool:
        """:meth:`reload` in a worker thread, logged as ``host_secrets_reload``.

        :returns: whether the secrets changed (False as well when the reload failed, which
            is logged with the exception type only). Never raises but for cancellation.
        """
        try:
            changed = await anyio.to_thread.run_sync(self.reload)
        except OSError as exc:
            self._reloads["failed"] += 1
            _log_failure("host_secrets_reload_failed", exc, trigger=trigger)
            return False
        self._log_reload(trigger, changed)
        return changed

    async def watch(
        self,
        interval: float,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Every ``interval`` seconds, reload if any file's stat signature changed.

        Runs until cancelled. The stat calls and reads run in a worker thread; a failing
        poll is logged (exception type only) and the next one goes ahead.
        """
        task_status.started()
        while True:
            await anyio.sleep(interval)
            try:
                changed = await anyio.to_thread.run_sync(self._poll)
            except Exception as exc:  # noqa: BLE001 - the watcher must outlive any one poll
                self._reloads["failed"] += 1
                _log_failure("host_secrets_poll_failed", exc)
                continue
            if changed is not None:
                self._log_reload("poll", changed)

    def _poll(self) -> bool | None:
        """Reload if the signature changed: whether the secrets changed, None if not read."""
        with self._lock:
            signature = _signature(self.directory)
            if self._scanned and signature == self._signature:
                return None
            try:
                changed = self._load()
            except UnsafeSecretsError:
                # Refused once per change, not at every poll: the next chmod is a change.
                self._signature = signature
                raise
            self._signature, self._scanned = signature, True
            return changed

    def _log_reload(self, trigger: str, changed: bool) -> None:
        self._reloads["changed" if changed else "unchanged"] += 1
        log.info(
            "host_secrets_reload", trigger=trigger, changed=changed, generation=self.generation
        )

    def _load(self) -> bool:
        """Read everything and swap it in; whether it differs. Caller holds the lock."""
        loaded = _read_directory(self.directory)
        previous = self._state
        changed = loaded != previous.loaded
        if changed:
            self._state = _State.build(previous.generation + 1, loaded)
        if changed or not self._scanned:
            log.info(
                "host_secrets_loaded",
                directory=str(self.directory),
                host_wide=len(loaded.host),
                tenants=len(loaded.tenants),
                total=loaded.total,
                generation=self._state.generation,
            )
        return changed


# -- reading -------------------------------------------------------------------------------


def _read_directory(directory: Path) -> _Loaded:
    """All secrets under ``directory``.

    :raises OSError: the directory exists but cannot be listed.
    """
    try:
        names = _visible(os.listdir(directory))
    except FileNotFoundError:
        log.warning("host_secrets_dir_missing", directory=str(directory))
        return _Loaded()
    _check_mode(directory, os.stat(directory).st_mode)
    host = _read_scope(directory, [n for n in names if n != TENANTS_DIR], tenant=None)
    tenants = _read_tenants(directory / TENANTS_DIR) if TENANTS_DIR in names else {}
    return _Loaded(host, tenants)


def _read_tenants(directory: Path) -> dict[str, Mapping[str, str]]:
    """Each tenant's own secrets, for the tenants that have any."""
    try:
        names = _visible(os.listdir(directory))
        _check_mode(directory, os.stat(directory).st_mode)
    except UnsafeSecretsError:
        raise
    except OSError as exc:
        _warn(f"{TENANTS_DIR} is not a readable directory ({_errno(exc)})")
        return {}
    tenants: dict[str, Mapping[str, str]] = {}
    for tenant in names:
        if not _valid(_TENANT, tenant):
            _warn("invalid tenant name (1-128 characters, no control characters)", tenant=tenant)
            continue
        try:
            files = _visible(os.listdir(directory / tenant))
            _check_mode(directory / tenant, os.stat(directory / tenant).st_mode)
        except UnsafeSecretsError:
            raise
        except OSError as exc:
            _warn(f"not a readable tenant directory ({_errno(exc)})", tenant=tenant)
            continue
        own = _read_scope(directory / tenant, files, tenant=tenant)
        if own:
            tenants[tenant] = own
    return tenants


def _read_scope(directory: Path, names: list[str], *, tenant: str | None) -> dict[str, str]:
    """Value → id for the files ``names`` (sorted) in ``directory``.

    The first :data:`MAX_SECRETS_PER_SCOPE` usable files count, in name order; when two
    files hold the same value the first name is its id.
    """
    found: dict[str, str] = {}
    accepted = 0
    for name in names:
        try:
            if not _valid(_SECRET_ID, name):
                raise _Ignored("invalid secret id (1-128 characters, no ] or control characters)")
            if accepted >= MAX_SECRETS_PER_SCOPE:
                raise _Ignored(f"more than {MAX_SECRETS_PER_SCOPE} secrets in this directory")
            value = _read_secret(directory / name)
        except _Ignored as why:
            _warn(str(why), secret_id=name, tenant=tenant)
            continue
        accepted += 1
        found.setdefault(value, name)
    return found


def _read_secret(path: Path) -> str:
    """The secret value held in the file at ``path`` (symlinks followed).

    :raises _Ignored: the file cannot serve as a secret.
    """
    try:
        # O_NONBLOCK: a FIFO put there by mistake must not hang the load.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _Ignored(f"unreadable ({_errno(exc)})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _Ignored("not a regular file")
        _check_mode(path, mode)
        with open(fd, "rb", closefd=False) as f:
            data = f.read(MAX_SECRET_FILE_BYTES + 1)
    except UnsafeSecretsError:
        raise
    except OSError as exc:
        raise _Ignored(f"unreadable ({_errno(exc)})") from None
    finally:
        os.close(fd)
    return _decode(data)


def _decode(data: bytes) -> str:
    """The value in a file's bytes: UTF-8 with one trailing newline (LF or CRLF) removed.

    :raises _Ignored: too large, not UTF-8, too short or blank.
    """
    if len(data) > MAX_SECRET_FILE_BYTES:
        raise _Ignored(f"larger than {MAX_SECRET_FILE_BYTES // 1024} KiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _Ignored("not UTF-8") from None
    if text.endswith("\r\n"):
        text = text[:-2]
    elif text.endswith("\n"):
        text = text[:-1]
    if len(text) < MIN_SECRET_CHARS:
        raise _Ignored(f"shorter than {MIN_SECRET_CHARS} characters")
    if not text.strip():
        # Redacting runs of blanks would shred every entry; no credential looks like that.
        raise _Ignored("only whitespace")
    return text


def _check_mode(path: Path, mode: int) -> None:
    """Warn if ``path`` (of stat mode ``mode``) is writable by its group; refuse it if it
    is writable by every user. Either is let pass on a read-only file system.

    :raises UnsafeSecretsError: writable by every user.
    """
    if not mode & (stat.S_IWGRP | stat.S_IWOTH) or _read_only(path):
        return
    if mode & stat.S_IWOTH:
        raise UnsafeSecretsError(path, stat.S_IMODE(mode))
    log.warning(
        "host_secrets_writable_by_group",
        path=str(path),
        mode=f"{stat.S_IMODE(mode):04o}",
        hint="anyone in the group can plant a secret; chmod g-w it",
    )


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _log_failure(event: str, exc: BaseException, **fields: str) -> None:
    """A failed reload: a refusal as an error naming the path, else a warning naming the
    exception type only (an OSError's message may quote a path that is a secret id, which
    is fine, but nothing else is known to be safe)."""
    if isinstance(exc, UnsafeSecretsError):
        log.error(
            "host_secrets_refused",
            path=str(exc.path),
            mode=f"{exc.mode:04o}",
            reason="writable by every user; the secrets loaded before stay in force",
            **fields,
        )
    log.warning(event, error=type(exc).__name__, **fields)


# -- change detection ----------------------------------------------------------------------


def _signature(directory: Path) -> Signature:
    """What :func:`_read_directory` would read, as stat results (symlinks followed).

    A Kubernetes Secret update swaps the ``..data`` link, so every followed file gets a new
    inode; an in-place write changes the size or mtime.

    :raises OSError: the directory exists but cannot be listed.
    """
    try:
        names = _visible(os.listdir(directory))
    except FileNotFoundError:
        return None
    entries: list[tuple[str, int, int, int, int]] = []
    for name in names:
        if _stat_into(entries, directory, name) and name == TENANTS_DIR:
            for tenant in _listing(directory / name):
                if _stat_into(entries, directory, f"{name}/{tenant}"):
                    for secret in _listing(directory / name / tenant):
                        _stat_into(entries, directory, f"{name}/{tenant}/{secret}")
    return tuple(entries)


def _stat_into(entries: list[tuple[str, int, int, int, int]], directory: Path, rel: str) -> bool:
    """Append ``rel``'s stat to ``entries``; whether it is a directory."""
    try:
        st = os.stat(directory / rel)
    except OSError as exc:
        entries.append((rel, -1, -1, exc.errno or 0, 0))
        return False
    entries.append((rel, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode))
    return stat.S_ISDIR(st.st_mode)


def _listing(directory: Path) -> list[str]:
    try:
        return _visible(os.listdir(directory))
    except OSError:
        return []  # recorded by its parent's stat; the load warns about it


# -- helpers -------------------------------------------------------------------------------


def _visible(names: Iterable[str]) -> list[str]:
    """Sorted names not starting with ``.`` (load order is name order, hence deterministic)."""
    return sorted(n for n in names if not n.startswith("."))


def _valid(pattern: re.Pattern[str], name: str) -> bool:
    if not 1 <= len(name) <= MAX_NAME_CHARS or pattern.fullmatch(name) is None:
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a name that is not UTF-8 arrives with surrogate escapes
        return False
    return True


def _errno(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, type(exc).__name__)


def _safe_name(pattern: re.Pattern[str], name: str) -> str:
    """``name`` as a log line may carry it: as is if valid, else escaped and truncated."""
    return name if _valid(pattern, name) else ascii(name)[:200]


def _warn(reason: str, *, secret_id: str | None = None, tenant: str | None = None) -> None:
    """The ``host_secret_ignored`` warning: which file or directory, and why; nothing else."""
    names: dict[str, str] = {}
    if secret_id is not None:
        names["secret_id"] = _safe_name(_SECRET_ID, secret_id)
    if tenant is not None:
        names["tenant"] = _safe_name(_TENANT, tenant)
    log.warning("host_secret_ignored", reason=reason, **names)
