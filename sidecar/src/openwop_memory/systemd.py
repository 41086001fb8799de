"""The parts of systemd's service protocol the sidecar speaks, without libsystemd.

- **Notification** (``sd_notify(3)``): datagrams such as ``READY=1`` to the socket named by
  ``NOTIFY_SOCKET`` (a path, or ``@name`` for an abstract socket).
- **Socket activation** (``sd_listen_fds(3)``): when ``LISTEN_PID`` is this process,
  ``LISTEN_FDS`` descriptors starting at 3 were passed, named by ``LISTEN_FDNAMES``.
- **Watchdog** (``sd_watchdog_enabled(3)``): ``WATCHDOG_USEC`` is the interval within which
  the service must send ``WATCHDOG=1``, when ``WATCHDOG_PID`` is absent or this process.

:meth:`SystemdEnvironment.take` reads all of it once and removes the variables from the
environment, so that no process started later acts on descriptors or a watchdog meant for
this one. Everything here is a no-op, or returns nothing, outside systemd.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass

from .errors import StartupError

LISTEN_FDS_START = 3
# What the workers' socket is called in LISTEN_FDNAMES: `FileDescriptorName=memory` in a
# socket unit, or, by default, that unit's own name.
WORKER_SOCKET_NAMES = ("memory", "openwop-memory.socket")
_LISTEN_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")
_WATCHDOG_VARIABLES = ("WATCHDOG_USEC", "WATCHDOG_PID")


@dataclass(frozen=True, slots=True)
class PassedDescriptor:
    """One descriptor systemd passed: its number and its ``FileDescriptorName=``."""

    fd: int
    name: str


@dataclass(frozen=True, slots=True)
class SystemdEnvironment:
    """What systemd told this process through its environment.

    ``notify_address`` is None when nothing listens for notifications;
    ``passed`` is empty without socket activation; ``watchdog_interval`` (seconds) is
    None when no watchdog is asked of this process.
    """

    notify_address: str | None = None
    passed: tuple[PassedDescriptor, ...] = ()
    watchdog_interval: float | None = None
    ignored: tuple[str, ...] = ()
    """Why variables present were not acted on (for the start-up log)."""

    @classmethod
    def take(cls, environ: MutableMapping[str, str] | None = None) -> SystemdEnvironment:
        """Read the variables of this process from ``environ`` (default ``os.environ``) and
        remove them from it. Passed descriptors are made close-on-exec.

        Variables naming another process (``LISTEN_PID``, ``WATCHDOG_PID``) are ignored,
        as libsystemd does: they were inherited from a parent, not meant for us.

        :raises StartupError: ``LISTEN_FDS`` or ``LISTEN_PID`` is not a number.
        """
        env = os.environ if environ is None else environ
        address = env.pop("NOTIFY_SOCKET", None) or None
        listen = {name: env.pop(name, None) for name in _LISTEN_VARIABLES}
        watchdog = {name: env.pop(name, None) for name in _WATCHDOG_VARIABLES}
        ignored: list[str] = []
        passed = _passed_descriptors(listen, ignored)
        interval = _watchdog_interval(watchdog, ignored)
        return cls(address, passed, interval, tuple(ignored))

    def notify(self, message: str) -> bool:
        """Send one notification (``READY=1``, ``WATCHDOG=1``, ``STATUS=...``); False when
        there is nowhere to send it or sending failed. Never raises: systemd going away
        must not take the service with it."""
        if self.notify_address is None:
            return False
        address = self.notify_address
        if address.startswith("@"):
            address = "\0" + address[1:]
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.sendto(message.encode(), address)
        except OSError:
            return False
        return True


def _passed_descriptors(
    listen: dict[str, str | None], ignored: list[str]
) -> tuple[PassedDescriptor, ...]:
    pid, count, names = listen["LISTEN_PID"], listen["LISTEN_FDS"], listen["LISTEN_FDNAMES"]
    if pid is None and count is None:
        return ()
    try:
        pid_number = int(pid or "")
        count_number = int(count or "")
    except ValueError:
        raise StartupError(
            f"socket activation: LISTEN_PID={pid!r} and LISTEN_FDS={count!r} must be numbers"
        ) from None
    if pid_number != os.getpid():
        ignored.append(f"LISTEN_PID={pid_number} is another process")
        return ()
    if count_number < 0:
        raise StartupError(f"socket activation: LISTEN_FDS={count_number} is negative")
    labels = names.split(":") if names else []
    if len(labels) != count_number:
        labels = ["unknown"] * count_number  # as libsystemd does when the counts disagree
    passed = []
    for offset, label in enumerate(labels):
        fd = LISTEN_FDS_START + offset
        # An exec'd child must not hold the listening socket: it would keep it open after
        # this process exits and systemd could not tell that the service stopped.
        with contextlib.suppress(OSError):
            os.set_inheritable(fd, False)
        passed.append(PassedDescriptor(fd, label))
    return tuple(passed)


def _watchdog_interval(watchdog: dict[str, str | None], ignored: list[str]) -> float | None:
    usec, pid = watchdog["WATCHDOG_USEC"], watchdog["WATCHDOG_PID"]
    if usec is None:
        return None
    if pid is not None and pid.strip() != str(os.getpid()):
        ignored.append(f"WATCHDOG_PID={pid} is another process")
        return None
    try:
        microseconds = int(usec)
    except ValueError:
        ignored.append(f"WATCHDOG_USEC={usec!r} is not a number")
        return None
    if microseconds <= 0:
        ignored.append(f"WATCHDOG_USEC={microseconds} is not positive")
        return None
    return microseconds / 1_000_000


def is_listening_unix_stream(sock: socket.socket) -> bool:
    """Whether ``sock`` is a Unix stream socket on which ``listen()`` was called (what
    ``ListenStream=`` with a path or ``@name`` and ``Accept=no`` passes)."""
    try:
        kind = sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE)
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    except OSError:
        return False
    return sock.family == socket.AF_UNIX and kind == socket.SOCK_STREAM and listening == 1


def socket_path(sock: socket.socket) -> str:
    """The address ``sock`` is bound to: a path, or ``@name`` for an abstract socket."""
    name = sock.getsockname()
    if isinstance(name, bytes):
        return "@" + name[1:].decode(errors="replace")
    return str(name)


def choose_listener(passed: Iterable[PassedDescriptor], wanted_path: str) -> socket.socket | None:
    """The listening Unix stream socket among ``passed``, set non-blocking; None when
    nothing was passed. With several, the names in ``LISTEN_FDNAMES`` decide first: the
    one named as in :data:`WORKER_SOCKET_NAMES`, when exactly one is; otherwise the one
    (among those so named, if any) bound to ``wanted_path`` (the ``socket`` setting).
    Descriptors not chosen are left open and untouched: they are systemd's.

    :raises StartupError: descriptors were passed but none (or no single one) fits.
    """
    passed = list(passed)
    if not passed:
        return None
    candidates: list[socket.socket] = []
    names: dict[int, str] = {}
    for descriptor in passed:
        try:
            sock = socket.socket(fileno=descriptor.fd)
        except OSError:
            continue  # not a socket, or not open
        if is_listening_unix_stream(sock):
            candidates.append(sock)
            names[descriptor.fd] = descriptor.name
        else:
            sock.detach()  # not ours to close
    described = ", ".join(f"fd {d.fd} ({d.name})" for d in passed)
    if not candidates:
        raise StartupError(
            f"systemd passed {described}, and none is a listening Unix stream socket: the "
            "socket unit needs ListenStream=/path with Accept=no"
        )
    chosen = candidates[0]
    if len(candidates) > 1:
        named = [s for s in candidates if names[s.fileno()] in WORKER_SOCKET_NAMES]
        wanted = os.path.abspath(wanted_path)
        matching = [s for s in named or candidates if socket_path(s) == wanted]
        if len(named) == 1:
            matching = named
        if len(matching) != 1:
            for sock in candidates:
                sock.detach()
            raise StartupError(
                f"systemd passed several listening Unix sockets ({described}), none named "
                f"{' or '.join(WORKER_SOCKET_NAMES)} alone nor bound to the socket setting "
                f"{wanted} alone; set FileDescriptorName=memory on the workers' socket, or "
                "socket to its path"
            )
        chosen = matching[0]
        for sock in candidates:
            if sock is not chosen:
                sock.detach()
    # Inherited sockets are blocking; accepting on one would stall the event loop.
    chosen.setblocking(False)
    return chosen
