"""Shared fixtures: a real sidecar process per test on a fresh socket and SQLite file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.sidecar import RawClient, Sidecar


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # aiosqlite is asyncio-only


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    # Unix socket paths are limited to ~107 bytes; pytest's tmp paths can get close.
    return tmp_path


@pytest.fixture
def sidecar(workdir: Path) -> Iterator[Sidecar]:
    with Sidecar(workdir) as s:
        yield s


@pytest.fixture
def rpc(sidecar: Sidecar) -> Iterator[RawClient]:
    with sidecar.client() as c:
        yield c
