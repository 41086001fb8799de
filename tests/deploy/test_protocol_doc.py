"""docs/PROTOCOL.md, the page users and other-language client authors read, names exactly
what exists: every method, error code and command-line flag it names is real, and every
real one is named; every file it names is in the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from openwop_memory.wire.admin import ADMIN_METHODS
from openwop_memory.wire.dispatch import _METHODS
from openwop_memory_client import MemoryServiceError
from support.sidecar import EXE

pytestmark = pytest.mark.backend_independent

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "PROTOCOL.md").read_text()


def error_codes() -> set[str]:
    codes: set[str] = set()
    pending: list[type[MemoryServiceError]] = [MemoryServiceError]
    while pending:
        cls = pending.pop()
        codes.add(cls.code)
        pending.extend(cls.__subclasses__())
    return codes


def help_flags(*argv: str) -> set[str]:
    out = subprocess.run(
        [EXE, *argv, "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", out)) - {"--help"}


def test_every_method_named_exists_and_every_method_is_named() -> None:
    methods = set(_METHODS) | set(ADMIN_METHODS)
    named = set(re.findall(r"`((?:host|memory|run|sidecar|admin)\.[A-Za-z]+)`", DOC))
    assert named == methods
    for method in methods:
        assert f"### `{method}`" in DOC, f"{method} has no section"


def test_every_error_code_named_exists_and_every_code_is_named() -> None:
    section = DOC.partition("\n## Errors\n")[2].partition("\n## ")[0]
    table = re.findall(r"^\| `([a-z_]+)`[^|]*\| -\d", section, flags=re.MULTILINE)
    assert sorted(table) == sorted(error_codes())


def test_every_flag_named_exists_and_every_flag_is_named() -> None:
    real = help_flags() | help_flags("serve") | help_flags("backup") | help_flags("forget")
    real |= help_flags("health") | help_flags("metrics") | help_flags("export")
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", DOC))
    assert named - real == set(), "named but not a flag"
    assert real - named == set(), "a flag the page does not name"


def test_every_file_named_is_in_the_repository() -> None:
    files = {p.name for p in ROOT.rglob("*") if ".venv" not in p.parts}
    for name in re.findall(r"[\w./-]+\.(?:md|py|json|toml|yaml)\b", DOC):
        assert Path(name).name in files, name
    for target in re.findall(r"\]\(([^)#]+)\)", DOC):
        assert target.startswith("http") or (ROOT / "docs" / target).exists(), target


def test_no_wording_meant_for_the_team() -> None:
    for phrase in ("issue note", "the redaction issue", "beside this file", "../shared", "MUST"):
        assert phrase not in DOC, phrase
