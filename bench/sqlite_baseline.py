"""The put floor: SQLite's own batched insert of the rows a sidecar put writes.

Same schema (the sidecar's migrations, imported), same pragmas as the sidecar's writer
connection (WAL, ``synchronous = NORMAL``, foreign keys, secure delete, the same WAL
checkpoint interval), same statements per transaction as its group commit (reserve the
sequence numbers in ``clock``, insert the entries, insert their change-feed records,
commit; the tags, terms and token counts the sidecar indexes after the put, off its path,
are not written here), rows of the same shape and size, a file on the same filesystem as
the sidecar's database. What it leaves out is everything the sidecar adds: the socket,
JSON-RPC, validation, redaction and the hand-off to the thread that commits. So ``sidecar
puts per second / these rows per second`` is the share of SQLite's speed the sidecar
delivers.

It runs in the calling thread, one connection, nothing else open on the file.
"""

from __future__ import annotations

import secrets
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from openwop_memory.storage.sqlite.keywords import tokens_to_store
from openwop_memory.storage.sqlite.schema import MIGRATIONS

PRAGMAS = (
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = NORMAL",
    "PRAGMA foreign_keys = ON",
    "PRAGMA secure_delete = ON",
    "PRAGMA journal_size_limit = 67108864",
    "PRAGMA wal_autocheckpoint = 4000",
)
_INSERT_ENTRIES = (
    "INSERT INTO entries (seq, id, scope_pk, content, tags, created_us, expires_us, tokens)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_CHANGES = (
    "INSERT INTO changes (tenant, scope_pk, entry_id, op, at_us, seq) VALUES (?, ?, ?, ?, ?, ?)"
)
_SCOPE_PK = 1


@dataclass(frozen=True)
class BatchedInsert:
    rows: int
    transactions: int
    seconds: float
    cpu_seconds: float  # this thread's CPU time while inserting

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("nan")


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    for pragma in PRAGMAS:
        conn.execute(pragma)
    return conn


def _create(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")
    for _, statements in MIGRATIONS:
        for statement in statements:
            if isinstance(statement, str):
                conn.execute(statement)
            else:
                statement(conn)
    conn.execute(
        "INSERT INTO scopes (scope_pk, tenant, key) VALUES (?, ?, ?)",
        (_SCOPE_PK, "bench", "bench-scope"),
    )
    conn.execute("COMMIT")


def _commit_batch(conn: sqlite3.Connection, entries: list[dict[str, Any]]) -> None:
    """One transaction as the sidecar's group commit writes it."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        seq, last_us = conn.execute(
            "UPDATE clock SET seq = seq + ?, last_us = max(last_us, ?) RETURNING seq - ?, last_us",
            (len(entries), time.time_ns() // 1000, len(entries)),
        ).fetchall()[0]
        rows: list[tuple[Any, ...]] = []
        changes: list[tuple[Any, ...]] = []
        for entry in entries:
            seq += 1
            entry_id = f"mem_{last_us:013x}{secrets.token_hex(10)}"
            content = entry["content"]
            rows.append(
                (
                    seq,
                    entry_id,
                    _SCOPE_PK,
                    content,
                    orjson.dumps(entry["tags"]),
                    last_us,
                    None,
                    tokens_to_store(content),
                )
            )
            changes.append(("bench", _SCOPE_PK, entry_id, "put", last_us, seq))
        conn.executemany(_INSERT_ENTRIES, rows)
        conn.executemany(_INSERT_CHANGES, changes)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def batched_insert(
    path: Path,
    next_entry: Callable[[], dict[str, Any]],
    *,
    rows_per_transaction: int,
    seconds: float,
    prefill: int,
    max_rows: int = 10_000_000,
) -> BatchedInsert:
    """Create a database at ``path``, load ``prefill`` rows untimed (so its indexes are as
    deep as the sidecar's), then insert ``rows_per_transaction`` rows a transaction for
    ``seconds`` (at most ``max_rows``), timed.

    :raises sqlite3.Error: the file could not be created or written.
    """
    conn = _connect(path)
    try:
        _create(conn)
        for start in range(0, prefill, 1000):
            _commit_batch(conn, [next_entry() for _ in range(min(1000, prefill - start))])
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        rows = transactions = 0
        elapsed = cpu = 0.0
        deadline = time.perf_counter() + seconds
        while rows < max_rows and (time.perf_counter() < deadline or transactions < 10):
            # Entries are made outside the clock, as the sidecar's are made by its clients.
            batch = [next_entry() for _ in range(rows_per_transaction)]
            cpu0, t0 = time.thread_time(), time.perf_counter()
            _commit_batch(conn, batch)
            elapsed += time.perf_counter() - t0
            cpu += time.thread_time() - cpu0
            rows += len(batch)
            transactions += 1
    finally:
        conn.close()
    return BatchedInsert(rows, transactions, elapsed, cpu)
