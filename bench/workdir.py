"""Temporary directories for benchmark runs."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# sun_path holds 108 bytes; a long $TMPDIR plus a socket name can overflow it.
_MAX_SOCKET_DIR = 80


@contextmanager
def bench_workdir(suite: str, *, keep: bool = False) -> Iterator[Path]:
    """A fresh directory for one suite's sockets, databases and logs.

    Removed afterwards, unless ``keep`` or the suite failed: then its path is printed to
    stderr so the server logs can be read.
    """
    base = tempfile.gettempdir()
    if len(base) > _MAX_SOCKET_DIR:
        base = "/tmp"
    path = Path(tempfile.mkdtemp(prefix=f"owm-bench-{suite}-", dir=base))
    try:
        yield path
    except BaseException:
        print(f"bench: {suite}: logs kept in {path}", file=sys.stderr)
        raise
    if keep:
        print(f"bench: {suite}: files kept in {path}", file=sys.stderr)
    else:
        shutil.rmtree(path, ignore_errors=True)
