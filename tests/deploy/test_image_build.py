"""The Dockerfile's build stage, run on this machine without a container engine.

Its ``COPY`` and ``RUN`` instructions are carried out in order in a scratch directory that
stands in for the image's ``/`` (every absolute path the instructions name is moved under
it), with the stage's ``ENV``, ``python`` being the system's Python 3.11 as in the base
image, and its ``pip``. The virtual environment it leaves is then run the way the final
stage runs it: its ``ENV``, ``ENTRYPOINT`` and ``CMD`` start the sidecar, and the
``HEALTHCHECK`` command must pass. The final stage's own ``RUN`` (users, removing the base
image's pip) changes the system, so it is not run here; tests/deploy/test_deployment.py checks what
it says.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.deploy_tools import ensure_deploy_tools
from test_deployment import DOCKERFILE, ROOT, _instructions, _stages

pytestmark = [pytest.mark.backend_independent, pytest.mark.timeout(600)]

# The directories of the image the instructions name, moved under the scratch root.
_MOVED = ("/opt/", "/tmp/", "/run/", "/var/")


def _moved(text: str, root: Path) -> str:
    """``text`` with every absolute path under :data:`_MOVED` moved under ``root``
    (``sqlite:////var/...`` included; ``.../x/tmp/`` is not the image's ``/tmp``)."""
    moved = re.sub(r"(?<![\w.-])(" + "|".join(map(re.escape, _MOVED)) + ")", f"{root}\\1", text)
    assert "sqlite:////" not in text or f"sqlite:///{root}" in moved, moved
    return moved


def _json_words(rest: str) -> list[str]:
    words = json.loads(rest)
    assert isinstance(words, list) and all(isinstance(w, str) for w in words), rest
    return words


def test_the_build_stage_makes_a_virtualenv_that_serves_as_the_image_says(
    tmp_path: Path,
) -> None:
    ensure_deploy_tools()  # the system's Python with venv and pip
    root = tmp_path / "image"
    tools = tmp_path / "tools"
    tools.mkdir()
    # What the base image has on PATH: `python` and its `pip`.
    (tools / "python").symlink_to("/usr/bin/python3")
    (tools / "pip").write_text('#!/bin/sh\nexec /usr/bin/python3 -m pip "$@"\n')
    (tools / "pip").chmod(0o755)
    stages = _stages(_instructions(DOCKERFILE.read_text()))
    build, final = stages[0], stages[-1]
    env = {"PATH": f"{tools}:/usr/bin:/bin", "HOME": str(tmp_path)}
    ignore = shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    for keyword, rest in build:
        if keyword == "ENV":
            for assignment in shlex.split(rest):
                name, _, value = assignment.partition("=")
                env[name] = value
        elif keyword == "COPY":
            source, destination = rest.split()
            target = Path(_moved(destination, root))
            target.parent.mkdir(parents=True, exist_ok=True)
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, target, ignore=ignore)
            else:
                shutil.copy(ROOT / source, target)
        elif keyword == "RUN":
            command = _moved(rest, root)
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", command],
                env=env,
                capture_output=True,
                text=True,
                timeout=500,
                check=False,
            )
            assert done.returncode == 0, f"RUN {rest}\n{done.stdout}{done.stderr}"
        else:
            assert keyword in ("FROM", "ARG"), f"not carried out here: {keyword} {rest}"
    (copied,) = [r for k, r in final if k == "COPY" and r.startswith("--from=build ")]
    _, source, destination = copied.split()
    assert source == destination, "the virtualenv is used where it was built"
    venv = Path(_moved(source, root))
    # Nothing to install or build with in the final image's environment.
    site = next(venv.glob("lib/python3*/site-packages"))
    for tool in ("pip", "setuptools"):
        assert not (site / tool).exists(), f"{tool} is left in the image's virtualenv"

    # The final stage's settings, as the container would run.
    run_env = {"HOME": str(tmp_path)}
    for keyword, rest in final:
        if keyword == "ENV":
            for assignment in shlex.split(rest):
                name, _, value = assignment.partition("=")
                run_env[name] = _moved(value.replace("$PATH", "/usr/bin:/bin"), root)
    for directory in ("OPENWOP_MEMORY_SOCKET", "OPENWOP_MEMORY_DATABASE"):
        path = run_env[directory].removeprefix("sqlite:///")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    (entrypoint,) = [_json_words(r) for k, r in final if k == "ENTRYPOINT"]
    (arguments,) = [_json_words(r) for k, r in final if k == "CMD"]
    (healthcheck,) = [r for k, r in final if k == "HEALTHCHECK"]
    probe = _json_words(healthcheck.split(" CMD ", 1)[1])
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*entrypoint, *arguments], env=run_env, stdout=out, stderr=out, cwd=tmp_path
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            checked = subprocess.run(
                probe, env=run_env, capture_output=True, text=True, timeout=30, check=False
            )
            if checked.returncode == 0 or time.monotonic() > deadline or proc.poll() is not None:
                break
            time.sleep(0.2)
        assert checked.returncode == 0, f"{checked.stderr}\n{log.read_text(errors='replace')}"
        assert json.loads(checked.stdout)["status"] == "ok"
        # STOPSIGNAL: the drain, then exit 0.
        (stop_signal,) = [r for k, r in final if k == "STOPSIGNAL"]
        proc.send_signal(signal.Signals[stop_signal])
        assert proc.wait(30) == 0, log.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    database = Path(run_env["OPENWOP_MEMORY_DATABASE"].removeprefix("sqlite:///"))
    assert database.is_relative_to(root) and database.exists(), database
