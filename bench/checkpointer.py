"""Force a WAL checkpoint from a process of its own: ``checkpointer.py DATABASE [MODE]``.

Prints ``start`` just before ``PRAGMA wal_checkpoint(MODE)`` (``TRUNCATE`` by default) and
``done BUSY LOG CHECKPOINTED SECONDS`` after it, then exits; the bench times its own reads
between the two lines. Standard library only, so the file runs as a plain script.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import Sequence

MODES = ("PASSIVE", "FULL", "RESTART", "TRUNCATE")


def main(argv: Sequence[str]) -> int:
    if not 1 <= len(argv) <= 2 or (len(argv) == 2 and argv[1] not in MODES):
        print(__doc__, file=sys.stderr)
        return 2
    mode = argv[1] if len(argv) == 2 else "TRUNCATE"
    conn = sqlite3.connect(argv[0], isolation_level=None)
    try:
        # Wait for the sidecar's writer as long as the sidecar itself would wait.
        conn.execute("PRAGMA busy_timeout = 5000")
        print("start", flush=True)
        began = time.perf_counter()
        busy, log, done = conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
        print(f"done {busy} {log} {done} {time.perf_counter() - began:.6f}", flush=True)
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
