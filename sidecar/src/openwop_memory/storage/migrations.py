"""The migration policy every backend follows, written once: a schema is a numbered list of
migrations; a database records the versions applied; a start applies the ones after the
database's, in order, and refuses a database newer than the code. A backend runs the steps
(its SQL, in its transaction, under its lock)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from .base import StorageStartupError

Step = TypeVar("Step")


def migrations_to_run(
    current: int, migrations: Sequence[tuple[int, Sequence[Step]]]
) -> list[tuple[int, Sequence[Step]]]:
    """The migrations after version ``current`` (0: a new database), in their order.

    :raises StorageStartupError: ``current`` is newer than the last migration: a newer
        sidecar wrote the database, and this one could misread it.
    """
    latest = migrations[-1][0]
    if current > latest:
        raise StorageStartupError(
            f"the database schema is version {current}, newer than this sidecar "
            f"knows ({latest}); upgrade openwop-memory"
        )
    return [(version, steps) for version, steps in migrations if version > current]
