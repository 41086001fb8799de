"""Several sidecars on one database, for the tests of a fleet."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from .backends import BACKENDS, Backend
from .sidecar import Sidecar

PG = BACKENDS["postgresql"]


@contextmanager
def fleet(workdir: Path, count: int, backend: Backend = PG, *args: str) -> Iterator[list[Sidecar]]:
    """``count`` running sidecars sharing the database ``workdir/shared``."""
    database = workdir / "shared"
    with ExitStack() as stack:
        yield [
            stack.enter_context(
                Sidecar(
                    workdir,
                    *args,
                    database=database,
                    socket_path=workdir / f"s{n}.sock",
                    backend=backend,
                )
            )
            for n in range(count)
        ]
