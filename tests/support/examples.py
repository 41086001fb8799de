"""The code blocks of the docs that the tests run as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from support.sidecar import unmeasured


def python_block(readme: Path, after: str = "") -> str:
    """The first ```python block of ``readme`` after the line ``after``."""
    text = readme.read_text()
    if after:
        text = text.partition(f"\n{after}\n")[2]
        assert text, f"{readme.name} has no line {after!r}"
    match = re.search(r"^```python\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)
    assert match, f"{readme.name} has no python block after {after!r}"
    return match.group(1)


def run_example(
    code: str, socket: Path, cwd: Path, env: Mapping[str, str] | None = None
) -> list[str]:
    """The lines ``code`` prints, run by this interpreter in ``cwd`` with the sidecar's
    socket in ``OPENWOP_MEMORY_SOCKET``, over ``env`` (default: this process's environment,
    unmeasured). AssertionError with its stderr if it fails."""
    base = unmeasured(os.environ) if env is None else dict(env)
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
        env={**base, "OPENWOP_MEMORY_SOCKET": str(socket)},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def says_it_prints(code: str, printed: list[str], page: str) -> None:
    """AssertionError unless every line ``printed`` stands in ``code`` as ``# <line>``."""
    for line in printed:
        assert f"# {line}" in code, f"{page} does not say it prints {line!r}"
