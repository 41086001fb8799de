"""The serve lock of a SQLite database: an ``flock`` on ``<database>-serve.lock`` beside it.

Every sidecar serving the database holds it shared (several may serve one file), for as
long as it runs; an import holds it exclusive. So an import is refused while any sidecar
serves the database (it would change the memoryRef key under a sidecar that keeps the one
it read at its start, splitting the memory), and a sidecar does not start while an import
runs. The kernel drops a lock when its holder dies, so a killed sidecar holds none.

The file (empty, ``0600``) is there while someone holds it: the last holder to let go
removes it, having made sure, by taking it exclusive, that no one else holds it. An
``flock`` lives on the file's inode, so each holder checks, once it has the lock, that
the path still names that inode (else it tries again): no process can hold a removed
file's lock while another locks its successor.
"""

from __future__ import annotations

import fcntl
import os

from ..base import DatabaseInUseError, StorageStartupError

SUFFIX = "-serve.lock"


class FileServeLock:
    """``<database>-serve.lock``, held from :meth:`acquire` to :meth:`release`."""

    def __init__(self, database: str) -> None:
        self.path = os.path.abspath(database) + SUFFIX
        self._fd: int | None = None

    def acquire(self, *, exclusive: bool) -> None:
        """Take the lock without waiting: shared to serve, exclusive to import.

        :raises DatabaseInUseError: it is held the other way (an import runs, or a sidecar
            serves), or exclusive by an import.
        :raises StorageStartupError: the file cannot be created or locked.
        """
        if self._fd is not None:
            return
        for _ in range(8):  # another process may remove the file between open and lock
            fd = self._open()
            try:
                fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise DatabaseInUseError(self._held_message(exclusive)) from None
            except OSError as exc:
                os.close(fd)
                raise StorageStartupError(f"cannot lock {self.path}: {exc.strerror}") from None
            if self._still_named(fd):
                self._fd = fd
                return
            os.close(fd)
        raise StorageStartupError(f"cannot lock {self.path}: it keeps being replaced")

    def release(self) -> None:
        """Drop the lock, and remove the file if no one else holds it. Idempotent; never
        raises."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if self._still_named(fd):
                os.unlink(self.path)
        except OSError:
            pass  # another holder, or the file is gone: it is theirs to remove
        finally:
            os.close(fd)

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CLOEXEC | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StorageStartupError(f"cannot create {self.path}: {exc.strerror}") from None

    def _still_named(self, fd: int) -> bool:
        try:
            named = os.stat(self.path)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)

    def _held_message(self, exclusive: bool) -> str:
        if exclusive:
            return (
                f"a sidecar serves this database (it holds {self.path}); stop every sidecar "
                "on it first: one keeps the memoryRef key it read at its start"
            )
        return (
            f"an import into this database is running (it holds {self.path}); start the "
            "sidecar once it is done"
        )
