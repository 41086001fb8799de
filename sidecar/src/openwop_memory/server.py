"""Process lifecycle: :func:`serve` → startup → accept loop → graceful shutdown.

Startup refuses a socket path where a live sidecar answers and replaces a stale socket
file; under systemd socket activation it serves the socket systemd passed instead, and
never removes it. The first SIGTERM or SIGINT stops accepting, lets requests already read
finish within ``drain_timeout``, flushes and checkpoints the database, removes the socket
it created and returns normally (exit 0); a second signal exits at once. SIGHUP re-reads
``secrets_dir`` (the host-wide and per-tenant secrets) and never stops the server. Under
a systemd watchdog it pings only while its event loop and its database answer (see
:meth:`Server._watchdog`).

Every listener survives running out of file descriptors (it backs off and tries again;
open connections go on being served: :mod:`.wire.accepting`). Each has slots of its own
(:mod:`.wire.slots`): the workers' socket ``max_connections``, of which one Unix user holds
at most ``max_connections_per_uid``; the admin socket ``max_admin_connections``, so that no
worker can lock the operator out. A connection beyond its slots gets one ``rate_limited``
line before it is closed.

The components that answer requests are built by :func:`~.app.open_app`; this module only
runs the process around them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import math
import os
import resource
import signal
import socket
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import anyio
import anyio.abc
import structlog

from . import __version__, gcpolicy
from .app import App, open_app
from .config import Settings, host_and_port
from .errors import StartupError
from .systemd import SystemdEnvironment, choose_listener, socket_path
from .wire import metrics_http
from .wire.accepting import accept_forever
from .wire.dispatch import Dispatcher
from .wire.fairness import FairGate
from .wire.framing import Connection, ConnectionLimits
from .wire.slots import Refusal, Slots
from .wire.tenant_binding import Peer, TenantBinding, peer_of

log = structlog.get_logger("openwop_memory.server")

# Descriptors the process needs besides its connections: the listener, the database and
# its companions on every SQLite connection, the event loop, logs, the secrets directory.
_RESERVED_DESCRIPTORS = 64
REFUSAL_RETRY_AFTER_MS = 250
# How long a thread holding the GIL may run before the event loop, waiting for it, gets it
# back. Large entries are redacted and keyrings compiled on threads, mostly in Python; at
# the interpreter's 5 ms a burst of either held every other connection's request for
# several slices (`make bench`'s "under attack" rows 3 and 8: a bystander's get p99 16 and
# 25 ms at 5 ms, 5 and 7.5 ms at 0.5 ms, the attacker's own puts no slower).
GIL_SWITCH_INTERVAL = 0.0005


async def serve(settings: Settings) -> None:
    """Start a sidecar with ``settings`` and serve until a stop is requested, then shut down
    gracefully (see the module's docstring).

    The socket path is checked before anything else is touched (unless systemd passed the
    listening socket); the components are opened next, and the listener last.

    :raises StartupError: the sidecar could not start (nothing was left behind).
    """
    systemd = SystemdEnvironment.take()
    for reason in systemd.ignored:
        log.info("systemd_variable_ignored", reason=reason)
    if settings.max_request_bytes <= 2 * settings.max_entry_size_bytes:
        log.warning(
            "request_cap_below_entry_size",
            hint="max_request_bytes should exceed twice max_entry_size_bytes, or large "
            "entries are refused as oversized lines rather than as too-large entries",
        )
    inherited = choose_listener(systemd.passed, settings.socket)
    try:
        if inherited is None:
            check_socket_path(settings.socket)
        _raise_descriptor_limit(descriptors_wanted(settings))
        if settings.admin_socket is not None:
            check_socket_path(settings.admin_socket)
        app = await open_app(settings, notify=systemd.notify)
    except BaseException:
        if inherited is not None:
            inherited.close()  # this process's copy; systemd keeps listening on its own
        raise
    metrics: metrics_http.MetricsListener | None = None
    admin: Listening | None = None
    try:
        metrics = await _listen_for_metrics(settings)
        if settings.admin_socket is not None:
            # Only the service's user (and root) may connect: the admin methods cross tenants.
            admin = await _listen_owned(settings.admin_socket, 0o600)
        listening = await _listen_for_workers(settings, inherited)
    except BaseException:
        if metrics is not None:
            await metrics.aclose()
        if admin is not None:
            await admin.listener.aclose()
            _remove_socket_file(admin)
        if inherited is not None:
            inherited.close()
        await app.aclose()
        raise
    await Server(settings, app, systemd).run(listening, metrics, admin)


def descriptors_wanted(settings: Settings) -> int:
    """The descriptors every listener's slots together may hold, plus the process's own:
    the limit at which the workers' socket never waits for one that another listener took."""
    wanted = settings.max_connections + _RESERVED_DESCRIPTORS
    if settings.admin_socket is not None:
        wanted += settings.max_admin_connections
    if settings.metrics_address is not None:
        wanted += settings.metrics_max_connections
    return wanted


async def _listen_for_metrics(settings: Settings) -> metrics_http.MetricsListener | None:
    """The metrics listener at ``metrics_address``, or None when it is not set.

    :raises StartupError: the address cannot be bound.
    """
    if settings.metrics_address is None:
        return None
    host, port = host_and_port(settings.metrics_address)
    try:
        return await metrics_http.listen(host, port)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise StartupError(
            f"cannot listen for metrics on {settings.metrics_address}: {reason}"
        ) from None


async def _listen(path: str, mode: int) -> anyio.abc.SocketListener:
    """A listening Unix socket at ``path``, created with ``mode``.

    :raises StartupError: the socket cannot be created there.
    """
    directory = os.path.dirname(os.path.abspath(path))  # noqa: ASYNC240
    try:
        os.makedirs(directory, exist_ok=True)
        # No moment where the socket exists with wider permissions than configured.
        with _umask(0o777 & ~mode):
            return await anyio.create_unix_listener(path, mode=mode)
    except OSError as exc:
        raise StartupError(f"cannot listen on {path}: {exc.strerror}") from None


@dataclass(frozen=True, slots=True)
class Listening:
    """The listener a sidecar serves on, and whether the socket file is this process's.

    ``created`` is the (device, inode) of the socket file this process made, so that only
    that file is removed at the end, and only while it is still the one at ``path``; None
    for a socket systemd passed, which is never removed.
    """

    listener: anyio.abc.SocketListener
    path: str
    created: tuple[int, int] | None


async def _listen_for_workers(settings: Settings, inherited: socket.socket | None) -> Listening:
    """The workers' listener: the socket systemd passed (``inherited``), or a new one at
    ``settings.socket`` created with ``socket_mode``.

    :raises StartupError: the socket cannot be created there, or the passed one used.
    """
    if inherited is not None:
        path = socket_path(inherited)
        if path != os.path.abspath(settings.socket):  # noqa: ASYNC240
            # The probe (`health --config`) looks where the setting says: say so at once.
            log.warning(
                "socket_setting_differs",
                socket=path,
                setting=settings.socket,
                hint="systemd passed a socket bound elsewhere; set socket to its path so "
                "that `openwop-memory health --config` finds it",
            )
        try:
            listener = await anyio.abc.SocketListener.from_socket(inherited)
        except ValueError as exc:
            inherited.close()
            raise StartupError(f"cannot serve the socket systemd passed: {exc}") from None
        return Listening(listener, path, None)
    return await _listen_owned(settings.socket, settings.socket_mode)


async def _listen_owned(path: str, mode: int) -> Listening:
    """A new listening socket at ``path`` (see :func:`_listen`), remembered as this
    process's own so that only that file is removed at the end.

    :raises StartupError: the socket cannot be created there.
    """
    listener = await _listen(path, mode)
    try:
        st = os.stat(path)
    except OSError as exc:
        await listener.aclose()
        raise StartupError(f"cannot listen on {path}: {exc.strerror}") from None
    return Listening(listener, path, (st.st_dev, st.st_ino))


def _remove_socket_file(listening: Listening) -> None:
    """Remove the socket file this process created, unless another process has replaced
    it meanwhile (a sidecar started while this one drained): never someone else's."""
    if listening.created is None:
        return
    with contextlib.suppress(FileNotFoundError):
        st = os.stat(listening.path)
        if (st.st_dev, st.st_ino) == listening.created:
            os.unlink(listening.path)


def check_socket_path(path: str) -> None:
    """Make ``path`` free for a new listener.

    :raises StartupError: a live listener answers there, or a non-socket file is there.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:  # a file where a directory of the path should be, a loop, ...
        raise StartupError(f"cannot use the socket path {path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise StartupError(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise StartupError(f"cannot probe the socket {path}: {exc.strerror}") from None
        os.unlink(path)  # stale: nothing listens
        log.info("stale_socket_removed", socket=path)
        return
    finally:
        probe.close()
    raise StartupError(f"another sidecar is already listening on {path}; refusing to start")


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _raise_descriptor_limit(wanted: int) -> None:
    """Raise the soft RLIMIT_NOFILE towards ``wanted`` (never above the hard limit, never
    lowering it), so that ``max_connections`` is not cut short by a small default; warn
    when the hard limit is too low for it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if target > soft:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning(
            "descriptor_limit_below_max_connections",
            limit=soft,
            wanted=wanted,
            hint="raise LimitNOFILE (or ulimit -n) or lower max_connections; past the limit "
            "new connections wait until descriptors are freed",
        )


class Server:
    """One sidecar process serving ``app`` on a listener: signals, the accept loop, the
    connections, the drain and the cleanup. It owns ``app`` once :meth:`run` starts and
    closes it on the way out."""

    def __init__(
        self, settings: Settings, app: App, systemd: SystemdEnvironment | None = None
    ) -> None:
        self.settings = settings
        self.app = app
        self._systemd = systemd or SystemdEnvironment()
        self._listening: Listening | None = None
        self._admin: Listening | None = None
        self.dispatcher = app.dispatcher
        self.connection_stats = app.stats.connections
        self._stop = anyio.Event()
        self._drain_deadline = math.inf
        self._connections: set[Connection] = set()
        self._no_connections = anyio.Event()
        self._no_connections.set()
        self._gate = FairGate()
        self._binding = TenantBinding(settings.tenant_binding)
        self._slots = Slots(settings.max_connections, settings.max_connections_per_uid)
        self._admin_slots = Slots(settings.max_admin_connections)
        # Listeners between a refusal and their next accepted connection: one log line an
        # episode, so that a storm does not flood the log.
        self._refusing: set[str] = set()

    def request_stop(self) -> None:
        if not self._stop.is_set():
            # One deadline for the whole drain, shared by every connection's last flush.
            self._drain_deadline = anyio.current_time() + self.settings.drain_timeout
        self._stop.set()

    async def run(
        self,
        listening: Listening,
        metrics: metrics_http.MetricsListener | None = None,
        admin: Listening | None = None,
    ) -> None:
        """Serve on ``listening`` (and scrapes on ``metrics``, operators on ``admin``)
        until a stop is requested, then shut down gracefully: close the app (flushing the
        storage), remove the sockets this process made, log ``stopped``."""
        self._listening = listening
        self._admin = admin
        listener = listening.listener
        notify = self._systemd.notify
        gcpolicy.settle_after_startup()
        sys.setswitchinterval(GIL_SWITCH_INTERVAL)
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(self._watch_signals)
                if metrics is not None:
                    limits = metrics_http.MetricsLimits(
                        self.settings.metrics_max_connections,
                        self.settings.metrics_render_interval,
                    )
                    tg.start_soon(
                        metrics_http.serve_metrics,
                        metrics,
                        self.app.service.metrics,
                        limits,
                        self.connection_stats,
                    )
                secrets_directory = self.app.secrets_directory
                if secrets_directory is not None:
                    tg.start_soon(secrets_directory.watch, self.settings.secrets_poll_interval)
                tg.start_soon(self.app.sweeper.run)
                tg.start_soon(self.app.service.indexer.run)
                async with anyio.create_task_group() as conns:
                    conns.start_soon(
                        self._accept, listener, conns, self.dispatcher, self._slots, "workers"
                    )
                    if admin is not None:
                        conns.start_soon(
                            self._accept,
                            admin.listener,
                            conns,
                            self.app.admin_dispatcher,
                            self._admin_slots,
                            "admin",
                        )
                    notify("READY=1\nSTATUS=serving")  # over a start's waiting status
                    watchdog = self._systemd.watchdog_interval
                    if watchdog is not None:
                        tg.start_soon(self._watchdog, watchdog)
                    log.info(
                        "ready",
                        socket=listening.path,
                        socket_activation=listening.created is None,
                        watchdog_seconds=watchdog,
                        version=__version__,
                    )
                    await self._stop.wait()
                    notify("STOPPING=1")
                    log.info("stopping", open_connections=len(self._connections))
                    if admin is not None:
                        await admin.listener.aclose()
                    await self._drain(listener, conns)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._cleanup()

    async def _watchdog(self, interval: float) -> None:
        """Send ``WATCHDOG=1`` every half ``interval`` while the sidecar can still serve.

        Each ping follows a storage health check that answered within a quarter of the
        interval and did not report ``writer_stuck``. So a blocked event loop (this task
        does not run), a database that no longer answers, or a commit that never ends stop
        the pings, and systemd restarts the service ``interval`` after the last one.
        Problems a restart cannot repair keep the pings going: failing writes, a full
        disk, a database server that refuses connections. A restart there would only
        drop every open run's keyring (the kubelet's liveness probe draws the same line).
        """
        period = interval / 2
        withheld: str | None = None
        tick = anyio.current_time()
        while True:
            with anyio.move_on_after(period / 2):
                reason: str | None = "health_check_timeout"
                reason = await self._watchdog_check()
            if reason is None:
                self._systemd.notify("WATCHDOG=1")
                if withheld is not None:
                    log.info("watchdog_resumed", was=withheld)
                    self._systemd.notify("STATUS=serving")
            elif reason != withheld:
                log.error("watchdog_withheld", reason=reason, restart_after_seconds=interval)
                self._systemd.notify(f"STATUS=watchdog withheld: {reason}")
            withheld = reason
            # Fixed ticks: a slow check delays this ping, never the ones after it.
            tick += period
            await anyio.sleep_until(max(tick, anyio.current_time()))

    async def _watchdog_check(self) -> str | None:
        """None when storage's health answers without a stuck writer; otherwise why the
        watchdog ping is withheld."""
        try:
            health = await self.app.storage.health()
        except Exception:  # noqa: BLE001 - it answered: the database is down, not us
            return None
        return "writer_stuck" if "writer_stuck" in health.problems else None

    async def _accept(
        self,
        listener: anyio.abc.SocketListener,
        conns: anyio.abc.TaskGroup,
        dispatcher: Dispatcher,
        slots: Slots,
        name: str,
    ) -> None:
        stats = self.connection_stats

        async def handle(stream: anyio.abc.SocketStream) -> None:
            raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)  # noqa: S610 - not Django
            peer = peer_of(raw)
            uid = None if peer is None else peer.uid
            refusal = slots.take(uid)
            if refusal is not None:
                await self._refuse(stream, dispatcher, slots, name, refusal, uid)
                return
            self._refusing.discard(name)
            stats.open += 1
            stats.accepted += 1
            conns.start_soon(self._serve_connection, stream, dispatcher, peer, slots)

        await accept_forever(listener, handle, stats, name)

    async def _refuse(
        self,
        stream: anyio.abc.SocketStream,
        dispatcher: Dispatcher,
        slots: Slots,
        name: str,
        refusal: Refusal,
        uid: int | None,
    ) -> None:
        """Answer one ``rate_limited`` line (``id: null``) on a connection beyond its
        listener's slots (or its user's share of them) and close it, reading nothing."""
        stats = self.connection_stats
        stats.refused += 1
        if name not in self._refusing:
            self._refusing.add(name)
            if refusal is Refusal.PEER:
                log.warning(
                    "connections_refused",
                    listener=name,
                    uid=uid,
                    max_connections_per_uid=slots.per_peer,
                )
            else:
                log.warning("connections_refused", listener=name, max_connections=slots.total)
        raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)  # noqa: S610 - not Django
        # A fresh socket's send buffer takes the short line at once; if it cannot, the
        # client is gone or broken and gets the bare close.
        with contextlib.suppress(OSError):
            raw.send(dispatcher.at_capacity(REFUSAL_RETRY_AFTER_MS))
        await stream.aclose()

    async def _serve_connection(
        self,
        stream: anyio.abc.SocketStream,
        dispatcher: Dispatcher,
        peer: Peer | None,
        slots: Slots,
    ) -> None:
        settings = self.settings
        stats = self.connection_stats
        take_line = dispatcher.take_line
        uid = None if peer is None else peer.uid
        try:
            raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)  # noqa: S610 - not Django
            # Tenant binding, and the per-uid shares of open runs and keyring memory, govern
            # the workers' socket; the admin socket is the operator's, not a worker's.
            if dispatcher is self.dispatcher:
                tenants = self._binding.tenants_for(peer) if self._binding.active else None
                take_line = functools.partial(dispatcher.take_line, tenants=tenants, uid=uid)
            conn = Connection(
                take_line,
                dispatcher.oversized,
                ConnectionLimits(
                    max_line_bytes=settings.max_request_bytes,
                    idle_timeout=settings.idle_timeout,
                    partial_line_timeout=settings.partial_line_timeout,
                    max_unsent_answer_bytes=settings.max_unsent_answer_bytes,
                    max_partial_lines_bytes=settings.max_partial_lines_bytes,
                ),
                gate=self._gate,
                stats=stats,
            )
            # See wire/framing.py for why the connection is an asyncio protocol.
            await asyncio.get_running_loop().create_unix_connection(lambda: conn, sock=raw)
        except BaseException:
            stats.open -= 1
            slots.give_back(uid)
            raise
        self._connections.add(conn)
        self._no_connections = anyio.Event()
        try:
            if self._stop.is_set():
                conn.stop_reading()
            await conn.serve()
        finally:
            try:
                # Still counted while its last answers flush: a drain waits for them too.
                await self._close(conn)
            finally:
                stats.open -= 1
                slots.give_back(uid)
                self._connections.discard(conn)
                if not self._connections:
                    self._no_connections.set()

    async def _close(self, conn: Connection) -> None:
        """Close a connection, flushing the answers it still has buffered, but never waiting
        for good on a client that stopped reading.

        The flush is bounded by ``drain_timeout``; during shutdown, by what is left of the
        drain's deadline. Whatever a client has not read by then is dropped.
        """
        limit = self.settings.drain_timeout
        if self._stop.is_set():
            limit = max(0.0, self._drain_deadline - anyio.current_time())
        with anyio.CancelScope(shield=True):
            await conn.close(limit)

    async def _drain(self, listener: anyio.abc.SocketListener, conns: anyio.abc.TaskGroup) -> None:
        await listener.aclose()
        for conn in list(self._connections):
            conn.stop_reading()
        with anyio.move_on_at(self._drain_deadline) as scope:
            await self._no_connections.wait()
        if scope.cancelled_caught:
            log.warning("drain_timeout", abandoned_connections=len(self._connections))
        conns.cancel_scope.cancel()

    async def _watch_signals(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        watched = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        async with anyio.create_task_group() as reloads:
            with anyio.open_signal_receiver(*watched) as signals:
                task_status.started()  # handlers are in place before anyone is told we are ready
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        # A task of its own: a slow disk must not hold up a stop signal.
                        reloads.start_soon(self._reload_host_secrets)
                    else:
                        self._on_stop_signal(signum)

    def _on_stop_signal(self, signum: int) -> None:
        """The first SIGTERM or SIGINT requests a graceful stop; the second exits at once."""
        if self._stop.is_set():
            log.warning("second_signal_exit", signal=signal.Signals(signum).name)
            os._exit(128 + signum)
        log.info("signal", signal=signal.Signals(signum).name)
        self.request_stop()

    async def _reload_host_secrets(self) -> None:
        secrets_directory = self.app.secrets_directory
        if secrets_directory is None:
            log.info("signal_ignored", signal="SIGHUP", reason="secrets_dir is not set")
            return
        await secrets_directory.reload_now("sighup")

    async def _cleanup(self) -> None:
        await self.app.aclose()
        for listening in (self._listening, self._admin):
            if listening is not None:
                _remove_socket_file(listening)
        log.info("stopped")
