"""A throwaway PostgreSQL server for tests: its own data directory and Unix socket, no TCP.

Debian's server programs live in a versioned directory, not on ``PATH``
(``scripts/ensure-postgresql`` installs them if needed and names the directory).
``initdb`` refuses to run as root, so as root the server runs as the ``postgres`` user.
``fsync`` and ``full_page_writes`` are off: the server lives for one test session and need
not survive a power cut. ``synchronous_commit`` stays on, so a commit is written before it is
acknowledged and survives a crash of the server process (the fault tests crash it).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Self

REPO = Path(__file__).resolve().parents[2]


def server_bindir() -> Path:
    """The directory of ``initdb``/``pg_ctl``, installing them if missing (see the script).

    :raises RuntimeError: the programs are missing and cannot be installed.
    """
    done = subprocess.run(
        [str(REPO / "scripts" / "ensure-postgresql")], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"PostgreSQL is not available: {done.stderr.strip()}")
    return Path(done.stdout.strip().splitlines()[-1])


class PostgresServer:
    """``initdb`` + ``pg_ctl start`` in a fresh temporary directory; ``stop`` removes it.

    ``restart``/``pause`` keep the data: fault tests take the server away under load.
    """

    def __init__(self, bindir: Path | None = None, *, max_connections: int = 300) -> None:
        self.bindir = bindir or server_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="openwop-pg-"))
        self.data = self.root / "data"
        self.socket_dir = self.root
        self.log = self.root / "server.log"
        self.max_connections = max_connections
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self.root.chmod(0o755)

    def _run(self, *argv: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if self._as_postgres else []
        done = subprocess.run([*prefix, *argv], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{argv[0]} failed: {done.stdout}{done.stderr}\n{log}")

    def init(self) -> Self:
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )
        return self

    def start(self) -> Self:
        options = " ".join(
            [
                "-c listen_addresses=''",
                f"-c unix_socket_directories={self.socket_dir}",
                f"-c max_connections={self.max_connections}",
                "-c fsync=off",
                "-c full_page_writes=off",
                "-c shared_buffers=64MB",
            ]
        )
        self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-o",
            options, "start",
        )  # fmt: skip
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast`` rolls back open transactions, ``immediate`` is a crash)."""
        if (self.data / "postmaster.pid").exists():
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def _processes(self) -> list[int]:
        """The postmaster's pid and those of its children (backends, background workers)."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # exited meanwhile
            if int(fields[1]) == postmaster:
                children.append(int(stat.parent.name))
        return [postmaster, *children]

    def pause(self) -> None:
        """Freeze the server (SIGSTOP to every process of it): connections stay open and
        nothing answers, as a hung server or a partitioned network does. :meth:`resume`."""
        for pid in self._processes():
            os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        for pid in self._processes():
            os.kill(pid, signal.SIGCONT)

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run ``sql`` as the superuser; its unaligned output."""
        done = subprocess.run(
            [str(self.bindir / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
             "-h", str(self.socket_dir), "-U", "postgres", "-d", database, "-c", sql],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"psql failed: {done.stderr.strip()}")
        return done.stdout

    def add_password_role(self, name: str, password: str) -> None:
        """A login role that must give ``password`` (scram-sha-256) on the Unix socket;
        every other role still connects without one (``trust``)."""
        self.psql(f"CREATE ROLE \"{name}\" LOGIN PASSWORD '{password}'")
        hba = self.data / "pg_hba.conf"
        hba.write_text(f"local all {name} scram-sha-256\n" + hba.read_text())
        self.psql("SELECT pg_reload_conf()")

    def url_as(self, database: str, user: str, password: str | None = None) -> str:
        """A URL for ``database`` as ``user`` (with ``password``, when given)."""
        who = f"{user}:{password}" if password is not None else user
        return f"postgresql://{who}@/{database}?host={self.socket_dir}"

    def create_database(self, name: str) -> str:
        """A new empty database; its URL (Unix socket, no password)."""
        self.psql(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def url(self, database: str) -> str:
        return f"postgresql://postgres@/{database}?host={self.socket_dir}"

    def __enter__(self) -> Self:
        try:
            return self.init().start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


class PgBouncer:
    """PgBouncer in transaction mode in front of ``server``, on a Unix socket of its own.

    ``default_pool_size`` server connections per database are shared by every client
    connection, transaction by transaction: what a transaction-mode pooler allows is all
    a client may rely on (no session state between transactions).
    """

    def __init__(self, server: PostgresServer, *, default_pool_size: int = 3) -> None:
        self.server = server
        self.dir = server.root / "pgbouncer"
        self.dir.mkdir()
        self.ini = self.dir / "pgbouncer.ini"
        self.ini.write_text(
            f"[databases]\n* = host={server.socket_dir}\n"
            "[pgbouncer]\nlisten_addr =\n"
            f"unix_socket_dir = {self.dir}\nlisten_port = 6432\n"
            f"auth_type = trust\nauth_file = {self.dir}/users.txt\n"
            f"pool_mode = transaction\ndefault_pool_size = {default_pool_size}\n"
            "max_client_conn = 1000\n"
            f"logfile = {self.dir}/pgbouncer.log\npidfile = {self.dir}/pgbouncer.pid\n"
        )
        (self.dir / "users.txt").write_text('"postgres" ""\n')
        if server._as_postgres:  # PgBouncer refuses to run as root, like initdb
            user = pwd.getpwnam("postgres")
            for path in (self.dir, self.ini, self.dir / "users.txt"):
                os.chown(path, user.pw_uid, user.pw_gid)

    def url(self, database: str) -> str:
        return f"postgresql://postgres@/{database}?host={self.dir}&port=6432"

    def __enter__(self) -> Self:
        exe = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        self.server._run(exe, "-d", str(self.ini))
        deadline = time.monotonic() + 10
        while not (self.dir / ".s.PGSQL.6432").exists():
            if time.monotonic() > deadline:
                raise RuntimeError("pgbouncer did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        pid = self.dir / "pgbouncer.pid"
        if pid.exists():
            os.kill(int(pid.read_text().strip()), signal.SIGTERM)
