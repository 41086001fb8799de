"""The floor under the sidecar's start-up: a bare interpreter that imports the libraries the
sidecar is built on, and nothing of its own.

Run as a script, it imports :data:`LIBRARIES`, builds one small pydantic model (pydantic
loads most of itself on the first model, and the sidecar builds its wire models at import),
runs a uvloop event loop once, and prints its resident MiB. :func:`measure` times that from
process start to the printed line, ``count`` times, so that the sidecar's idle RSS and
start to ready read as "the floor plus what the sidecar adds" on any machine.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from dataclasses import dataclass

# What serving imports besides the sidecar's own code: sidecar/pyproject.toml's
# dependencies, and the standard-library modules among them that weigh something.
LIBRARIES = (
    "asyncio",
    "sqlite3",
    "uvloop",
    "anyio",
    "structlog",
    "orjson",
    "aiosqlite",
    "ahocorasick_rs",
    "pydantic",
)


@dataclass(frozen=True)
class Floor:
    rss_mib: float  # median resident MiB once everything is imported
    seconds: float  # median seconds from process start to that point


def _main() -> None:
    import importlib

    for name in LIBRARIES:
        importlib.import_module(name)
    import pydantic
    import uvloop

    class _Model(pydantic.BaseModel):
        name: str
        tags: tuple[str, ...] = ()

    _Model.model_validate({"name": "x", "tags": ["y"]})
    uvloop.run(asyncio.sleep(0))
    with open("/proc/self/status") as f:
        rss_kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    print(rss_kib / 1024, flush=True)


async def measure(count: int = 3) -> Floor:
    """The medians of ``count`` fresh interpreters (this one's executable), one at a time.

    :raises RuntimeError: a floor process failed.
    """
    rss: list[float] = []
    seconds: list[float] = []
    for _ in range(max(1, count)):
        started = time.perf_counter()
        process = await asyncio.create_subprocess_exec(
            sys.executable, __file__, stdout=asyncio.subprocess.PIPE
        )
        assert process.stdout is not None
        line = await process.stdout.readline()
        elapsed = time.perf_counter() - started
        await process.wait()
        if process.returncode != 0 or not line.strip():
            raise RuntimeError(f"the import floor exited with {process.returncode}")
        rss.append(float(line))
        seconds.append(elapsed)
    return Floor(statistics.median(rss), statistics.median(seconds))


if __name__ == "__main__":
    _main()
