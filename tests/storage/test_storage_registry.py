"""Backends are chosen by URL scheme and imported only when their scheme is used."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from openwop_memory.config import Settings
from openwop_memory.storage.base import StorageStartupError
from openwop_memory.storage.memory.backend import MemoryStorage
from openwop_memory.storage.registry import SCHEMES, create_storage, factory_for, scheme_of
from openwop_memory.storage.sqlite.backend import SqliteStorage

pytestmark = pytest.mark.backend_independent


def test_sqlite_url_makes_a_sqlite_store_with_the_group_settings(tmp_path: Path) -> None:
    settings = Settings.model_validate(
        {
            "database": f"sqlite:///{tmp_path}/memory.db",
            "sqlite": {"synchronous": "FULL", "busy_timeout": "250ms", "read_connections": 3},
        }
    )
    store = create_storage(settings.database, settings, create=True)
    assert isinstance(store, SqliteStorage)
    assert store.path == f"{tmp_path}/memory.db"
    assert store.synchronous == "FULL"
    assert store.busy_timeout_ms == 250
    assert store.read_connections == 3


@pytest.mark.anyio
async def test_memory_url_makes_a_store_of_that_name_shared_in_the_process() -> None:
    """``memory://NAME`` is a database of this process: two stores of one name see the same
    data, another name is another database, and ``memory://`` names none."""
    settings = Settings.model_validate({"database": "memory://registry-test"})
    first = create_storage(settings.database, settings, create=True)
    again = create_storage("memory://registry-test", settings, create=False)
    other = create_storage("memory://registry-test-other", settings, create=True)
    assert isinstance(first, MemoryStorage) and first.name == "registry-test"
    for store in (first, again, other):
        await store.open()
    try:
        assert await first.ref_key() == await again.ref_key() != await other.ref_key()
    finally:
        for store in (first, again, other):
            await store.close()
    missing = create_storage("memory://never-made", settings, create=False)
    with pytest.raises(StorageStartupError, match="no in-memory database"):
        await missing.open()
    with pytest.raises(StorageStartupError, match="needs a name"):
        create_storage("memory://", settings, create=True)


def test_only_the_configured_backend_is_imported() -> None:
    """A SQLite sidecar never imports the PostgreSQL driver (an optional extra)."""
    code = (
        "import sys\n"
        "from openwop_memory.config import Settings\n"
        "from openwop_memory.storage.registry import create_storage\n"
        "create_storage('sqlite:///x.db', Settings(), create=True)\n"
        "assert 'asyncpg' not in sys.modules, 'asyncpg imported'\n"
        "assert 'openwop_memory.storage.postgresql.backend' not in sys.modules\n"
        "create_storage('postgresql://u@/d?host=/nowhere', Settings(), create=True)\n"
        "assert 'asyncpg' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert "postgresql" in SCHEMES and "memory" in SCHEMES


@pytest.mark.parametrize("url", ["mysql://x/y", "sqlite:/no-slashes", "", "memory.db"])
def test_an_unknown_scheme_is_a_clear_startup_error(url: str) -> None:
    with pytest.raises(StorageStartupError, match="unknown database URL scheme"):
        factory_for(url)


def test_scheme_of() -> None:
    assert scheme_of("sqlite:////abs/x.db") == "sqlite"
    assert scheme_of("postgresql://u@h/d") == "postgresql"
    assert scheme_of("x.db") == ""


def test_backends_are_imported_lazily() -> None:
    """Loading the settings and the server imports no backend module (the backends'
    settings models only) and no database driver; making the SQLite store imports SQLite's
    modules only."""
    probe = (
        "import sys\n"
        "import openwop_memory.server\n"
        "from openwop_memory.config import Settings\n"
        "from openwop_memory.storage.registry import create_storage\n"
        "before = set(sys.modules)\n"
        "settings = Settings()\n"
        "create_storage(settings.database, settings, create=True)\n"
        "after = set(sys.modules)\n"
        "print(sorted(m for m in before if m.startswith('openwop_memory.storage')))\n"
        "print(sorted(m for m in after - before if m.startswith('openwop_memory.storage')))\n"
        "print(sorted(m for m in after if m.split('.')[0] in"
        " ('asyncpg', 'psycopg', 'psycopg2', 'psycopg_pool')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    before, added, drivers = map(ast.literal_eval, result.stdout.splitlines())
    settings_only = {f"openwop_memory.storage.{b}{m}" for b in SCHEMES for m in ("", ".settings")}
    backends = [f"openwop_memory.storage.{scheme}" for scheme in SCHEMES]
    assert {m for m in before if m.startswith(tuple(backends))} <= settings_only, before
    assert {
        "openwop_memory.storage.sqlite.backend",
        "openwop_memory.storage.sqlite.factory",
    } <= set(added)
    assert not [m for m in added if "postgresql" in m or ".memory." in m], added
    assert drivers == []


def test_every_registered_scheme_has_its_settings_table() -> None:
    """A backend's ``[scheme]`` table is a field of ``Settings`` typed by the model the
    registry names, so a new backend cannot be registered without being configurable."""
    from openwop_memory.config import GROUPS
    from openwop_memory.storage.registry import BACKENDS

    for scheme, backend in BACKENDS.items():
        assert Settings.model_fields[scheme].annotation is backend.settings
        assert GROUPS[scheme] is backend.settings
        assert isinstance(getattr(Settings.model_validate({}), scheme), backend.settings)
