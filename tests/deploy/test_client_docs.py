"""The Python examples of README.md ("A worker in Python") and client/README.md (the
package's description) run as written against a real sidecar, and print what their
comments say they print."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.examples import python_block, run_example
from support.sidecar import Sidecar

ROOT = Path(__file__).resolve().parents[2]
# Each README, and the heading its example follows ("" for its first python block).
EXAMPLES = {"README.md": "## A worker in Python", "client/README.md": ""}


def test_the_readme_worker_runs_and_prints_what_it_says(sidecar: Sidecar, tmp_path: Path) -> None:
    code = python_block(ROOT / "README.md", after=EXAMPLES["README.md"])
    expected = [
        "stored: call it with [REDACTED:openai]",
        "best match: call it with [REDACTED:openai]",
    ]
    for line in expected:
        assert f"# {line}" in code, f"the README no longer says it prints {line!r}"
    out = run_example(code, sidecar.socket, tmp_path)
    assert out[0] == expected[0]
    assert out[1].startswith("expires: ")
    assert out[2] == "own write visible: False"
    assert re.fullmatch(r"next run sees: \S+ call it with \[REDACTED:openai\]", out[3]), out[3]
    assert out[4:] == expected[1:]


def test_the_client_readme_runs_and_prints_what_it_says(sidecar: Sidecar, tmp_path: Path) -> None:
    code = python_block(ROOT / "client" / "README.md")
    shown = '"/run/openwop-memory/memory.sock"'
    assert shown in code
    out = run_example(code.replace(shown, repr(str(sidecar.socket))), sidecar.socket, tmp_path)
    assert "# the user prefers metric units" in code
    assert len(out) == 2 and out[1] == "the user prefers metric units"
    when = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\+00:00"  # a datetime in UTC, printed
    assert re.fullmatch(rf"mem_\w+ {when} {when}", out[0]), out[0]


@pytest.mark.backend_independent
@pytest.mark.parametrize("readme", sorted(EXAMPLES))
def test_the_examples_call_only_what_the_client_has(readme: str) -> None:
    from openwop_memory_client import AsyncMemoryClient, AsyncMemoryRun

    code = python_block(ROOT / readme, after=EXAMPLES[readme])
    called = re.findall(r"\b(run|client)\.([a-z_]+)\(", code)
    assert ("run", "search") in called
    for owner, name in called:
        cls = AsyncMemoryRun if owner == "run" else AsyncMemoryClient
        assert callable(getattr(cls, name, None)), f"{readme}: {owner}.{name}"
