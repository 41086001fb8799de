"""The system programs the deployment tests run (systemd-analyze, unshare, useradd, the
system interpreter's venv), installed by ``scripts/ensure-deploy-tools`` when missing, as
``scripts/ensure-postgresql`` does for the PostgreSQL server."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@functools.cache
def ensure_deploy_tools() -> str:
    """Make the programs available (once per test session); return the first line of
    ``systemd-analyze --version``.

    :raises RuntimeError: a program is missing and cannot be installed.
    """
    done = subprocess.run(
        [str(REPO / "scripts" / "ensure-deploy-tools")],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the deployment tests' programs are missing: {done.stderr.strip()}")
    return done.stdout.strip().splitlines()[-1]
