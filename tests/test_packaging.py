"""Both distributions build an sdist and a wheel that ``twine check`` accepts, offline, and
the client's wheel holds the client alone and asks for nothing of the daemon's."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.backend_independent

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    for project in ("client", "sidecar"):
        # Without isolation: the build uses this environment's setuptools, fetching nothing.
        subprocess.run(
            [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), project],
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=300,
        )
    return out


def test_sdists_and_wheels_pass_twine_check(dist: Path) -> None:
    names = sorted(p.name for p in dist.iterdir())
    assert names == [
        "openwop_memory-0.1.0-py3-none-any.whl",
        "openwop_memory-0.1.0.tar.gz",
        "openwop_memory_client-0.1.0-py3-none-any.whl",
        "openwop_memory_client-0.1.0.tar.gz",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *(str(dist / n) for n in names)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_client_wheel_is_the_client_alone(dist: Path) -> None:
    with zipfile.ZipFile(dist / "openwop_memory_client-0.1.0-py3-none-any.whl") as wheel:
        files = wheel.namelist()
        metadata = wheel.read("openwop_memory_client-0.1.0.dist-info/METADATA").decode()
    assert "openwop_memory_client/py.typed" in files
    assert not [f for f in files if f.startswith("openwop_memory/")]
    requires = sorted(
        line.split(":", 1)[1].strip().split(">")[0].split("<")[0]
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    )
    assert requires == ["anyio", "pydantic"]
    # The package index shows the README as the description.
    assert "MemoryEntry" in metadata


def test_the_daemons_description_is_more_than_a_pointer(dist: Path) -> None:
    with zipfile.ZipFile(dist / "openwop_memory-0.1.0-py3-none-any.whl") as wheel:
        metadata = wheel.read("openwop_memory-0.1.0.dist-info/METADATA").decode()
    description = metadata.partition("\n\n")[2]
    assert "openwop-memory serve" in description and "Redaction" in description
