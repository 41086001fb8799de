"""Both distributions build an sdist and a wheel that ``twine check`` accepts, offline; the
client's wheel holds the client alone, asks for nothing of the daemon's, and installed on its
own talks to a real sidecar."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import anyio
import pydantic
import pytest
from support.sidecar import Sidecar, unmeasured

pytestmark = pytest.mark.backend_independent

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # From a copy: an sdist build writes build/, *.egg-info and a release tree into the
    # project, and tests running beside this one copy those projects (the image's build
    # stage, the install page) and must not see a directory vanish under them.
    sources = tmp_path_factory.mktemp("sources")
    ignore = shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    for project in ("client", "sidecar"):
        shutil.copytree(ROOT / project, sources / project, ignore=ignore)
    for project in ("client", "sidecar"):
        # Without isolation: the build uses this environment's setuptools, fetching nothing.
        subprocess.run(
            [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), project],
            cwd=sources,
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
    # `make test` installs twine beside the environment, in .venv/twine (the Makefile says why).
    twine = {**os.environ, "PYTHONPATH": str(Path(sys.prefix) / "twine")}
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *(str(dist / n) for n in names)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=twine,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_client_wheel_is_the_client_alone(dist: Path) -> None:
    with zipfile.ZipFile(dist / "openwop_memory_client-0.1.0-py3-none-any.whl") as wheel:
        files = wheel.namelist()
        metadata = wheel.read("openwop_memory_client-0.1.0.dist-info/METADATA").decode()
    assert "openwop_memory_client/py.typed" in files
    assert not [f for f in files if f.startswith("openwop_memory/")]
    lines = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    requires = sorted(
        line.split(":", 1)[1].strip().split(">")[0].split("<")[0]
        for line in lines
        if "extra ==" not in line
    )
    assert requires == ["anyio", "pydantic"]
    # Only the optional LangGraph store brings more, as an extra.
    extras = sorted(
        re.split(r"[<>=;, ]", line.split(":", 1)[1].strip())[0]
        for line in lines
        if "extra ==" in line
    )
    assert extras == ["langgraph"]
    # The package index shows the README as the description.
    assert "MemoryEntry" in metadata


def test_the_daemons_description_is_more_than_a_pointer(dist: Path) -> None:
    with zipfile.ZipFile(dist / "openwop_memory-0.1.0-py3-none-any.whl") as wheel:
        metadata = wheel.read("openwop_memory-0.1.0.dist-info/METADATA").decode()
    description = metadata.partition("\n\n")[2]
    assert "openwop-memory serve" in description and "Redaction" in description


def test_the_client_wheel_alone_talks_to_a_sidecar(
    dist: Path, tmp_path: Path, sidecar: Sidecar
) -> None:
    """The wheel as another project installs it (docs/workers.md, "Installing the client in
    another project"): unpacked by pip into a directory of its own and imported from there, with
    its two dependencies and nothing of this checkout (``-S``: no site directory, so no
    editable install of either package)."""
    wheel = "openwop_memory_client-0.1.0-py3-none-any.whl"
    page = (ROOT / "docs" / "workers.md").read_text()
    assert f"pip install dist/{wheel}" in page
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
    subprocess.run(
        [*pip, "--target", str(target), str(dist / wheel)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    dependencies = [os.path.dirname(os.path.dirname(m.__file__ or "")) for m in (anyio, pydantic)]
    script = f"""
import sys
sys.path[:0] = [{str(target)!r}, *{sorted(set(dependencies))!r}]
import openwop_memory_client as c
assert c.__file__.startswith({str(target)!r}), c.__file__
with c.MemoryClient({str(sidecar.socket)!r}) as client:
    ref = client.issue_ref("t", "agent")
    with client.run("packaged", "t") as run:
        run.put(ref, "installed from the wheel")
    with client.run("packaged-reader", "t") as run:
        print([e.content for e in run.search(ref, "wheel")])
assert "openwop_memory" not in sys.modules
"""
    done = subprocess.run(
        [sys.executable, "-S", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=unmeasured(os.environ),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "['installed from the wheel']\n"


def test_make_dist_installs_the_build_tools_alone() -> None:
    """``make dist`` in a fresh checkout installs the `dist` extra (build, twine,
    setuptools) and builds; neither the packages nor the test toolchain come first."""
    planned = subprocess.run(
        ["make", "--dry-run", "--always-make", "dist"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    installs = [line for line in planned.splitlines() if "pip install" in line]
    assert installs == [
        ".venv/bin/python -m pip install --quiet --upgrade pip",
        ".venv/bin/python -m pip install --quiet -e '.[dist]'",
    ]
    assert ".venv/bin/twine check --strict dist/*" in planned
