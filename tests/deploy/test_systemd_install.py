"""systemd/README.md, followed to the letter on this machine.

Every command of every ``sh`` block of the page runs, in order, from a copy of the checkout,
inside a mount namespace whose ``/etc``, ``/opt``, ``/usr/local``, ``/var`` and ``/run`` are
overlays with throwaway upper layers: a scratch root standing in for ``/`` that leaves the
host as it was. What a stock Debian 12 lacks (``/etc/sysusers.d``) and whatever an earlier
install left is removed from it first, and root's ``PATH`` finds a failing ``python3``
first, as it finds a Python under ``/root`` on some hosts. Only the lines that need a
running systemd cannot run here (the test machines have none); the test does what systemd
would do for them with the *installed* units: it binds the socket as
``openwop-memory.socket`` says, makes the state directory as ``StateDirectory=`` says, and
starts ``ExecStart=`` as ``User=`` with the socket as descriptor 3, the unit's ``UMask=``
and ``WorkingDirectory=``, the drop-ins' ``EnvironmentFile=``, and reads its notifications.
After the page's SQLite service has stopped, the PostgreSQL variant the page installs (the
drop-in, the URL in its environment file) starts the same way against a throwaway server
that comes up 2 s after it: the sidecar waits for it, then serves.
"""

from __future__ import annotations

import configparser
import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.deploy_measure import measure_probe
from support.deploy_tools import ensure_deploy_tools
from support.postgres import PostgresServer

pytestmark = [pytest.mark.backend_independent, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "systemd" / "README.md"
# What stands in for "/": each of these is an overlay of the host's directory.
_SCRATCH = ("/etc", "/opt", "/usr/local", "/var", "/run")
# A command that needs a running service manager; the test stands in for it.
_NEEDS_SYSTEMD = re.compile(
    r"^(systemctl (daemon-reload|start|stop|restart|reload|status)|journalctl)\b"
)
WORKER_USER = "agent-worker"
# What a stock Debian 12 does not have (/etc/sysusers.d among them: step 2 must create it)
# and what an earlier install on this machine may have left: removed from the scratch root
# before the page runs, so that it starts from a fresh system whatever the host has.
_NOT_ON_A_FRESH_SYSTEM = (
    "/etc/sysusers.d",
    "/etc/openwop-memory",
    "/etc/tmpfiles.d/openwop-memory.conf",
    "/etc/systemd/system/openwop-memory.service",
    "/etc/systemd/system/openwop-memory.socket",
    "/etc/systemd/system/openwop-memory.service.d",
    "/etc/systemd/system/sockets.target.wants/openwop-memory.socket",
    "/etc/systemd/system/multi-user.target.wants/openwop-memory.service",
    "/opt/openwop-memory",
    "/usr/local/bin/openwop-memory",
    "/run/openwop-memory",
    "/var/lib/openwop-memory",
)
_USERS = ("openwop-memory", WORKER_USER)
# Root's PATH finds this `python3` first, as it finds a pyenv or conda Python under /root on
# some hosts: a step that runs plain `python3` fails, whatever this machine has.
_DECOY_PYTHON = """#!/bin/sh
echo "a python3 under /root found first on PATH: name /usr/bin/python3" >&2
exit 97
"""


def shell_blocks(text: str) -> list[list[str]]:
    """The commands of each ``sh`` block: continuation lines joined, comments dropped."""
    blocks = []
    for body in re.findall(r"^```sh\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        joined = body.replace("\\\n", " ")
        commands = []
        for line in joined.splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(line.strip())
        blocks.append(commands)
    return blocks


def unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text())
    return parser


class Namespace:
    """A process holding a mount namespace with the scratch overlays; commands enter it."""

    def __init__(self, scratch: Path) -> None:
        mounts = [f"mount -t tmpfs scratch {scratch}"]
        for i, directory in enumerate(_SCRATCH):
            upper, work = scratch / f"u{i}", scratch / f"w{i}"
            mounts.append(f"mkdir -p {upper} {work}")
            mounts.append(
                f"mount -t overlay overlay -o lowerdir={directory},upperdir={upper},"
                f"workdir={work} {directory}"
            )
        mounts.append(f"rm -rf {' '.join(_NOT_ON_A_FRESH_SYSTEM)}")
        for user in _USERS:
            mounts.append(f"{{ ! id -u {user} >/dev/null 2>&1 || userdel {user}; }}")
            mounts.append(f"{{ ! getent group {user} >/dev/null || groupdel {user}; }}")
        script = " && ".join(mounts) + " && echo ready && exec sleep 3600"
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != b"ready":
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
            raise RuntimeError(f"cannot set up the scratch root: {err.decode()}")

    @property
    def root(self) -> Path:
        """The namespace's ``/``, as seen from outside it."""
        return Path(f"/proc/{self.proc.pid}/root")

    def argv(self, *command: str, cwd: Path = Path("/")) -> list[str]:
        # Entering a mount namespace moves to its root: the directory is named again.
        return ["nsenter", f"--target={self.proc.pid}", "--mount", f"--wd={cwd}", "--", *command]

    def run(self, command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv("bash", "-euo", "pipefail", "-c", command, cwd=cwd),
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    def bound_listener(self, path: str, backlog: int) -> socket.socket:
        """A listening socket bound to ``path`` inside the namespace, so that its name is
        that path (as for systemd's own), received here over a socket pair."""
        here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        script = (
            "import socket, sys\n"
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
            "s.bind(sys.argv[1]); s.listen(int(sys.argv[2]))\n"
            "socket.send_fds(socket.socket(fileno=int(sys.argv[3])), [b'l'], [s.fileno()])\n"
        )
        with here, there:
            subprocess.run(
                self.argv(
                    "/usr/bin/python3", "-c", script, path, str(backlog), str(there.fileno())
                ),
                pass_fds=[there.fileno()],
                check=True,
                timeout=30,
            )
            _, fds, _, _ = socket.recv_fds(here, 1, 1)
        return socket.socket(fileno=fds[0])

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def _ids(ns: Namespace, user: str, group: str) -> tuple[int, int]:
    """uid and gid of ``user`` and ``group`` in the scratch root's user database."""
    uid = gid = -1
    for line in (ns.root / "etc/passwd").read_text().splitlines():
        if line.split(":")[0] == user:
            uid = int(line.split(":")[2])
    for line in (ns.root / "etc/group").read_text().splitlines():
        if line.split(":")[0] == group:
            gid = int(line.split(":")[2])
    assert uid >= 0 and gid >= 0, (user, group)
    return uid, gid


class StandInManager:
    """What systemd does for ``systemctl start openwop-memory.socket openwop-memory.service``,
    from the units installed in the scratch root."""

    def __init__(self, ns: Namespace, workdir: Path, log_name: str = "service.log") -> None:
        self.ns = ns
        self.workdir = workdir
        self.log_name = log_name
        self.listener: socket.socket | None = None
        self.notify: socket.socket | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.messages: list[str] = []

    def start(self) -> None:
        units = self.ns.root / "etc/systemd/system"
        socket_unit = unit(units / "openwop-memory.socket")["Socket"]
        service = unit(units / "openwop-memory.service")["Service"]
        path = socket_unit["ListenStream"]
        owner = _ids(self.ns, socket_unit["SocketUser"], socket_unit["SocketGroup"])
        user = _ids(self.ns, service["User"], service["Group"])
        # The socket unit: created by the manager (root), then handed to its owner; a file
        # left by an earlier start is replaced, as systemd does.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(str(self.ns.root) + path)
        self.listener = self.ns.bound_listener(path, int(socket_unit.get("Backlog", "128")))
        os.chown(str(self.ns.root) + path, *owner)
        os.chmod(str(self.ns.root) + path, int(socket_unit["SocketMode"], 8))
        # StateDirectory=: /var/lib/<name> for each name, owned by the service's user, with
        # its mode.
        for name in service["StateDirectory"].split():
            state = self.ns.root / "var/lib" / name
            state.mkdir(mode=int(service["StateDirectoryMode"], 8), exist_ok=True)
            os.chown(state, *user)
        # The manager's notification socket (inside the scratch /run, writable by the user).
        notify_path = "/run/test-notify.sock"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(str(self.ns.root) + notify_path)
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.ns.root) + notify_path)
        os.chmod(str(self.ns.root) + notify_path, 0o666)  # noqa: S103 - systemd's is too
        watchdog_seconds = float(service["WatchdogSec"].removesuffix("s"))
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LISTEN_FDS": "1",
            "LISTEN_FDNAMES": "openwop-memory.socket",
            "NOTIFY_SOCKET": notify_path,
            "WATCHDOG_USEC": str(int(watchdog_seconds * 1_000_000)),
            **self.environment_files(),
        }
        exec_start = shlex.split(service["ExecStart"])
        wrapper = (
            f"umask {service['UMask']}; cd {shlex.quote(service['WorkingDirectory'])}; "
            "gid=$1; shift; export LISTEN_PID=$$; "
            'exec setpriv --reuid="$0" --regid="$gid" --init-groups "$@"'
        )
        fd = self.listener.fileno()

        def as_descriptor_3() -> None:
            os.dup2(fd, 3)
            os.set_inheritable(3, True)

        with open(self.workdir / self.log_name, "wb") as log:
            self.proc = subprocess.Popen(
                self.ns.argv("/bin/sh", "-c", wrapper, str(user[0]), str(user[1]), *exec_start),
                stdout=log,
                stderr=log,
                env=env,
                close_fds=False,
                preexec_fn=as_descriptor_3,
            )
        self.wait_for("READY=1")

    def environment_files(self) -> dict[str, str]:
        """The variables of the drop-ins' ``EnvironmentFile=`` files (``-``: optional)."""
        env: dict[str, str] = {}
        drop_ins = self.ns.root / "etc/systemd/system/openwop-memory.service.d"
        for conf in sorted(drop_ins.glob("*.conf")):
            named = unit(conf)
            if not named.has_section("Service") or "EnvironmentFile" not in named["Service"]:
                continue
            name = named["Service"]["EnvironmentFile"]
            path = Path(str(self.ns.root) + name.removeprefix("-"))
            if name.startswith("-") and not path.exists():
                continue
            for line in path.read_text().splitlines():
                key, sep, value = line.partition("=")
                if sep and not key.startswith("#"):
                    env[key.strip()] = value.strip()
        return env

    def wait_for(self, message: str, timeout: float = 30.0) -> None:
        assert self.notify is not None and self.proc is not None
        deadline = time.monotonic() + timeout
        while message not in self.messages:
            if self.proc.poll() is not None and message == "READY=1":
                raise AssertionError(f"the service exited {self.proc.returncode}: {self.log()}")
            self.notify.settimeout(max(0.01, min(1.0, deadline - time.monotonic())))
            try:
                self.messages.extend(self.notify.recv(4096).decode().split("\n"))
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"no {message} from the service: {self.log()}") from None

    def log(self) -> str:
        path = self.workdir / self.log_name
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        self.wait_for("STOPPING=1", timeout=5)
        return code

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for sock in (self.listener, self.notify):
            if sock is not None:
                sock.close()


@pytest.fixture
def scratch_root(tmp_path: Path) -> Iterator[Namespace]:
    if os.geteuid() != 0:
        pytest.fail("the install test needs root, as CI has")
    ensure_deploy_tools()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    ns = Namespace(scratch)
    try:
        yield ns
    finally:
        ns.close()


def _checkout_copy(tmp_path: Path) -> Path:
    """The files the page's commands read, without build output of earlier installs."""
    checkout = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    for part in ("client", "sidecar", "systemd"):
        shutil.copytree(ROOT / part, checkout / part, ignore=ignore)
    return checkout


def test_the_install_page_runs_as_written(tmp_path: Path, scratch_root: Namespace) -> None:
    ns = scratch_root
    checkout = _checkout_copy(tmp_path)
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "python3").write_text(_DECOY_PYTHON)
    (decoy / "python3").chmod(0o755)
    env = {
        **os.environ,
        "WORKER_USER": WORKER_USER,
        "PATH": f"{decoy}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    }
    for name in [n for n in env if n.startswith("OPENWOP_MEMORY_") or n == "NOTIFY_SOCKET"]:
        del env[name]
    manager = StandInManager(ns, tmp_path)
    stood_in: list[str] = []
    ran: dict[str, subprocess.CompletedProcess[str]] = {}
    try:
        for block in shell_blocks(README.read_text()):
            for command in block:
                if _NEEDS_SYSTEMD.match(command):
                    stood_in.append(command)
                    if command.startswith("systemctl start"):
                        assert "openwop-memory.socket" in command
                        # The worker the access section names, created as an admin would.
                        added = ns.run(f"useradd --no-create-home {WORKER_USER}", checkout, env)
                        assert added.returncode == 0, added.stderr
                        manager.start()
                    continue
                result = ran[command] = ns.run(command, checkout, env)
                assert result.returncode == 0, (
                    f"systemd/README.md: `{command}` failed ({result.returncode}):\n"
                    f"{result.stdout}{result.stderr}\n{manager.log()}"
                )
        assert manager.proc is not None, "the page never starts the service"
        assert any(c.startswith("systemctl daemon-reload") for c in stood_in)
        # The virtualenv runs on the system's interpreter, which the service user can read
        # and ProtectHome=yes does not hide.
        venv = (ns.root / "opt/openwop-memory/pyvenv.cfg").read_text()
        assert re.search(r"^home = /usr/bin$", venv, re.MULTILINE), venv
        # The units were verified as installed, without a warning, and again with the
        # PostgreSQL drop-in.
        verify, with_drop_in = [c for c in ran if c.startswith("systemd-analyze verify")]
        for name in ("openwop-memory.socket", "openwop-memory.service"):
            assert f"/etc/systemd/system/{name}" in verify
        for command in (verify, with_drop_in):
            assert not (ran[command].stdout + ran[command].stderr).strip(), ran[command]
        drop_in = ns.root / "etc/systemd/system/openwop-memory.service.d/postgresql.conf"
        assert drop_in.read_text() == (ROOT / "systemd/openwop-memory-postgresql.conf").read_text()
        _assert_security_quoted(ran)
        # Enabled: started at boot, the socket before the service.
        wants = ns.root / "etc/systemd/system"
        assert (wants / "sockets.target.wants/openwop-memory.socket").is_symlink()
        assert (wants / "multi-user.target.wants/openwop-memory.service").is_symlink()
        # What the commands left behind is what the unit and the configuration expect.
        secrets = ns.root / "etc/openwop-memory/secrets"
        uid, gid = _ids(ns, "openwop-memory", "openwop-memory")
        assert (secrets.stat().st_uid, secrets.stat().st_gid) == (uid, gid)
        assert secrets.stat().st_mode & 0o777 == 0o700
        runtime = ns.root / "run/openwop-memory"
        assert (runtime.stat().st_gid, runtime.stat().st_mode & 0o777) == (gid, 0o750)
        assert '"level":"warning"' not in manager.log().replace(" ", ""), manager.log()
        # WatchdogSec= of the unit reached the sidecar, which pings at once and then every
        # half interval.
        manager.wait_for("WATCHDOG=1", timeout=10)
        assert '"socket_activation":true' in manager.log().replace(" ", ""), manager.log()
        # The probe, as installed, answers (what it costs is make bench's deployment suite).
        measure_probe(
            "/run/openwop-memory/memory.sock", ns.argv("openwop-memory", "health"), env=env, calls=1
        )
        # The page's backup landed where root sees it, of the size the sidecar reported.
        (backed_up,) = [c for c in ran if c.startswith("openwop-memory backup")]
        copy = ns.root / "var/lib/openwop-memory/backups/memory.db"
        assert f"backed up {copy.stat().st_size} bytes to" in ran[backed_up].stdout
        assert manager.stop() == 0, manager.log()
        assert (ns.root / "run/openwop-memory/memory.sock").is_socket()
    finally:
        manager.close()
    _start_the_postgresql_variant(ns, tmp_path, env)


def _assert_security_quoted(ran: dict[str, subprocess.CompletedProcess[str]]) -> None:
    """The page's ``systemd-analyze security`` with the drop-in: the number it quotes."""
    (command,) = [c for c in ran if c.startswith("systemd-analyze security")]
    measured = re.search(r"Overall exposure level for openwop-memory.service: ([\d.]+)",
                         ran[command].stdout)  # fmt: skip
    assert measured is not None, ran[command]
    text = " ".join(README.read_text().split())
    (quoted,) = re.findall(r"With the drop-in `systemd-analyze security` rates the unit ([\d.]+)",
                           text)  # fmt: skip
    assert float(quoted) == float(measured.group(1)), (quoted, ran[command].stdout)


def _start_the_postgresql_variant(ns: Namespace, tmp_path: Path, env: dict[str, str]) -> None:
    """Steps 6 and 7 of the page left the drop-in and the URL's file (a placeholder, which the
    operator edits: here the throwaway server's URL). The service, started with the
    drop-in's EnvironmentFile=, finds the server down, waits, and serves once it is up."""
    database_env = ns.root / "etc/openwop-memory/database.env"
    assert database_env.stat().st_mode & 0o777 == 0o600
    assert "OPENWOP_MEMORY_DATABASE=postgresql://" in database_env.read_text()
    with PostgresServer() as server:
        url = server.create_database("memory")
        database_env.write_text(f"OPENWOP_MEMORY_DATABASE={url}\n")
        server.stop()
        manager = StandInManager(ns, tmp_path, log_name="service-postgresql.log")
        late = threading.Timer(2.0, server.start)
        late.start()
        try:
            manager.start()
            ready = manager.messages.index("READY=1")
            waiting = [
                m
                for m in manager.messages[:ready]
                if m.startswith("STATUS=waiting for the database")
            ]
            assert waiting, manager.messages
            assert '"event":"database_waiting"' in manager.log().replace(" ", "")
            assert '"backend":"postgresql"' in manager.log().replace(" ", ""), manager.log()
            config = "/etc/openwop-memory/openwop-memory.toml"
            health = subprocess.run(
                ns.argv("openwop-memory", "health", "--config", config),
                env=env, capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            assert health.returncode == 0, health.stdout + health.stderr
            assert manager.stop() == 0, manager.log()
        finally:
            late.join()
            manager.close()
