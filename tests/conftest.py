"""Shared fixtures, each on a real sidecar process with a real socket and database.

Every sidecar uses the backend chosen by ``--backend`` (default ``sqlite``), so one suite
runs against each backend: ``pytest --backend NAME``.

A sidecar is a process of its own forked from the test process (:mod:`support.forked`: no
interpreter start, same code); ``Sidecar(..., fresh=True)`` runs the console script instead,
for tests of start-up, imports or absolute memory; ``OPENWOP_TEST_FRESH=1`` does so for all.

``sidecar``/``rpc``: a fresh sidecar per test. ``shared_sidecar``: one sidecar per test
module, reached with ``client`` (tests keep apart by names of their own, see
:mod:`support.names`) or ``shared_client`` (a prefix of the test's own is put on every run and
tenant, see :class:`support.shared.SharedClient`). ``backend``/``store``: each backend in
turn and an open store of it, for the tests of the storage layer itself.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from openwop_memory.storage.base import Storage
from support import backends
from support.shared import SharedClient
from support.sidecar import (
    RawClient,
    Sidecar,
    inherited_settings,
    module_sidecar,
    socket_workdir,
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backend",
        default=os.environ.get("OPENWOP_TEST_BACKEND", "sqlite"),
        choices=sorted(backends.BACKENDS),
        help="storage backend of every sidecar the tests start (env OPENWOP_TEST_BACKEND)",
    )


def pytest_configure(config: pytest.Config) -> None:
    backends.select(config.getoption("--backend"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    backend = backends.selected().name
    if backend == "sqlite":
        return
    skip = pytest.mark.skip(reason=f"reads SQLite directly; the sidecars run on {backend}")
    kept, dropped = [], []
    for item in items:
        if item.get_closest_marker("backend_independent"):
            dropped.append(item)  # already run in the default pass: nothing here differs
            continue
        if item.get_closest_marker("sqlite_only"):
            item.add_marker(skip)
        kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_unconfigure(config: pytest.Config) -> None:
    backends.POSTGRES.close()  # the throwaway server, if a test started it


def pytest_report_header(config: pytest.Config) -> str:
    return f"storage backend of the end-to-end tests: {backends.selected().name}"


@pytest.fixture(params=sorted(backends.BACKENDS))
def backend(request: pytest.FixtureRequest) -> backends.Backend:
    """Each backend in turn (for tests of the storage layer itself, which choose their own),
    but those a test's ``across_processes`` or ``migrates`` marker rules out."""
    chosen = backends.BACKENDS[request.param]
    if request.node.get_closest_marker("across_processes") and not chosen.shared:
        pytest.skip(f"a {chosen.name} database lives in one process: no other reaches it")
    if request.node.get_closest_marker("migrates") and not chosen.migrated:
        pytest.skip(f"a {chosen.name} database has no older schema to migrate from")
    return chosen


@pytest.fixture
async def store(backend: backends.Backend, tmp_path: Path) -> AsyncIterator[Storage]:
    """A new, open store of ``backend`` on a database of its own (see :mod:`support.store`)."""
    storage = backend.storage(tmp_path / "store.db")
    await storage.open()
    try:
        yield storage
    finally:
        await storage.close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # aiosqlite is asyncio-only


@pytest.fixture(scope="session", autouse=True)
def isolated_environment() -> Iterator[None]:
    """Every test, and every process it starts, runs without the ``OPENWOP_MEMORY_*`` settings
    or the systemd ``NOTIFY_SOCKET`` of the shell pytest was started from (restored at the end).

    Session-wide, so that sidecars of module-scoped fixtures start without them too. A test
    that wants one sets it itself: ``Sidecar(..., env=...)`` or ``monkeypatch.setenv``.
    """
    with pytest.MonkeyPatch.context() as patch:
        for name in inherited_settings(os.environ):
            patch.delenv(name)
        yield


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory another Unix user can reach (pytest's are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="owm-uid-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        subprocess.run(["rm", "-rf", str(path)], check=False)


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """The test's directory for sockets, databases and logs: ``tmp_path`` (kept by pytest for a
    look after a failure) when a socket path under it fits the Unix limit of 107 bytes, else a
    short directory in /tmp, removed after the test (see :func:`support.sidecar.socket_workdir`)."""
    with socket_workdir(tmp_path) as path:
        yield path


@pytest.fixture
def sidecar(workdir: Path) -> Iterator[Sidecar]:
    with Sidecar(workdir) as s:
        yield s


@pytest.fixture
def rpc(sidecar: Sidecar) -> Iterator[RawClient]:
    with sidecar.client() as c:
        yield c


@pytest.fixture(scope="module")
def shared_sidecar(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Sidecar]:
    """One sidecar with default settings for all tests of the requesting module.

    Its tests must leave it running, and keep apart by names of their own.
    """
    name = request.module.__name__.removeprefix("test_")
    with module_sidecar(tmp_path_factory, name) as s:
        yield s


@pytest.fixture
def client(shared_sidecar: Sidecar) -> Iterator[RawClient]:
    """A plain connection of its own to the module's ``shared_sidecar``."""
    with shared_sidecar.client() as c:
        yield c


@pytest.fixture
def shared_client(shared_sidecar: Sidecar) -> Iterator[SharedClient]:
    """A connection of its own to the module's ``shared_sidecar`` that puts a prefix unique to
    the test on every ``runId`` and ``tenant`` it sends: tests can name runs and tenants as
    they like and still never meet."""
    with SharedClient.connect(shared_sidecar) as c:
        yield c
