"""The test support itself: what every other test relies on without checking it.

The caller's ``OPENWOP_MEMORY_*`` settings never reach a test or a sidecar it starts, and a
work directory always leaves room for a Unix socket path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.sidecar import (
    SOCKET_NAME_ROOM,
    SOCKET_PATH_MAX,
    RawClient,
    Sidecar,
    check_socket_path,
    inherited_settings,
    socket_workdir,
)

pytestmark = pytest.mark.backend_independent

TESTS = Path(__file__).resolve().parent
# What a developer's shell might hold; each would change other tests' results.
CALLERS_SETTINGS = {
    "OPENWOP_MEMORY_MAX_ENTRY_SIZE_BYTES": "10",
    "OPENWOP_MEMORY_REDACTION": "reject",
    "NOTIFY_SOCKET": "/nonexistent/notify.sock",
}


def test_no_setting_of_the_caller_reaches_a_test_or_its_sidecar(client: RawClient) -> None:
    """Run by the test below under the caller's settings (and by every pass, without them)."""
    assert inherited_settings(os.environ) == []
    caps = client.call("host.capabilities")["capabilities"]["memory"]
    assert caps["maxEntrySizeBytes"] == 65536
    client.call("run.begin", runId="r", tenant="t", secrets=[{"id": "k", "value": "s3cr3t-v"}])
    entry = client.call("memory.put", runId="r", memoryRef="n", entry={"content": "a s3cr3t-v"})
    assert entry["content"] == "a [REDACTED:k]"  # rewritten, not rejected


def test_the_callers_settings_are_removed_for_every_test() -> None:
    """A pytest started with settings in its environment runs the test above unchanged; the
    module's shared sidecar, started before any test function, is among what it checks."""
    name = "test_no_setting_of_the_caller_reaches_a_test_or_its_sidecar"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", f"{TESTS / 'test_support.py'}::{name}"],
        cwd=TESTS.parents[1],
        env={**os.environ, **CALLERS_SETTINGS},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout, done.stdout


def test_inherited_settings_are_the_sidecars_own_names() -> None:
    environ = {**CALLERS_SETTINGS, "OPENWOP_TEST_BACKEND": "sqlite", "PATH": "/bin"}
    assert sorted(inherited_settings(environ)) == sorted(CALLERS_SETTINGS)


def test_a_long_work_directory_is_replaced_by_a_short_one(tmp_path: Path) -> None:
    long = tmp_path / ("d" * (SOCKET_PATH_MAX - len(os.fsencode(tmp_path))))
    long.mkdir()
    with socket_workdir(long) as workdir:
        assert workdir != long and workdir.is_dir()
        check_socket_path(workdir / ("s" * SOCKET_NAME_ROOM))
    assert not workdir.exists()  # the short directory is the fixture's to remove
    with socket_workdir(tmp_path) as workdir:
        assert workdir == tmp_path  # pytest's own, kept for a look after a failure
    assert tmp_path.is_dir()


def test_a_socket_path_over_the_limit_fails_with_its_reason(tmp_path: Path) -> None:
    fits = Path("/" + "s" * (SOCKET_PATH_MAX - 1))
    assert check_socket_path(fits) == fits
    too_long = Path("/" + "s" * SOCKET_PATH_MAX)
    with pytest.raises(ValueError, match=r"is 108 bytes, over the 107 bytes a Unix socket path"):
        check_socket_path(too_long)
    with pytest.raises(ValueError, match=r"over the 107 bytes"):
        Sidecar(tmp_path, socket_path=too_long)
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    with (
        pytest.raises(ValueError, match=r"over the 107 bytes"),
        socket_workdir(tmp_path / ("x" * 100), short_base=deep),
    ):
        pass
    assert list(deep.iterdir()) == []  # the directory it tried is gone again
