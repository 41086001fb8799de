"""The docs match the code. The configuration table (docs/configuration.md): every setting
has a row, and the default it shows is the setting's default (read back through the
settings' own validators, so ``7d``, ``"0660"`` and ``{}`` are checked as the sidecar would
read them). docs/ARCHITECTURE.md: every file it names exists, and every name it quotes is in
the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from openwop_memory.config import GROUPS, Settings, setting_fields

pytestmark = pytest.mark.backend_independent

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
# Where a relative path in ARCHITECTURE.md may start: the repository, or either package.
_PATH_ROOTS = [
    ROOT,
    ROOT / "sidecar" / "src" / "openwop_memory",
    ROOT / "client" / "src" / "openwop_memory_client",
]
_QUOTED = re.compile(r"`([^`]+)`")
_CODE_NAME = re.compile(r"^([A-Za-z_][\w.]*)(\(.*\))?$")
# | `name` | `default` ... | meaning |
_ROW = re.compile(r"^\| `([a-z_.]+)` \| ([^|]*) \|")


def documented_defaults() -> dict[str, str]:
    """Setting name → the default cell of its row in the configuration table."""
    rows: dict[str, str] = {}
    for line in CONFIGURATION.read_text().splitlines():
        match = _ROW.match(line)
        if match:
            rows.setdefault(match.group(1), match.group(2).strip())
    return rows


def test_every_setting_has_a_row() -> None:
    missing = set(setting_fields()) - set(documented_defaults())
    assert not missing, f"settings without a row in docs/configuration.md: {missing}"


@pytest.mark.parametrize("name", sorted(setting_fields()))
def test_the_documented_default_is_the_real_one(name: str) -> None:
    cell = documented_defaults()[name]
    field = setting_fields()[name]
    shown = re.match(r"`([^`]*)`", cell)
    if field.default is None:
        assert shown is None, f"{name}: the default is unset, docs/configuration.md shows {cell!r}"
        return
    assert shown is not None, f"{name}: no `value` in the default cell {cell!r}"
    group, _, key = name.rpartition(".")
    value = shown.group(1)
    if group:
        parsed = getattr(Settings.model_validate({group: {key: value}}), group)
        assert isinstance(parsed, GROUPS[group])
        shown_as = f"{name}: docs/configuration.md shows {value!r}"
        assert getattr(parsed, key) == field.default, shown_as
    else:
        parsed_value = getattr(Settings.model_validate({name: value}), name)
        assert parsed_value == field.default, f"{name}: docs/configuration.md shows {value!r}"


def test_the_documented_health_thresholds_are_the_real_ones(tmp_path: Path) -> None:
    """docs/configuration.md and PROTOCOL.md give ``disk_full`` as under 16 MiB free and
    ``writer_stuck`` as a commit in flight past the busy timeout plus 10 s: the constants say
    the same."""
    from openwop_memory.storage.sqlite import backend as sqlite

    assert sqlite._LOW_DISK_BYTES == 16 << 20
    store = sqlite.SqliteStorage(str(tmp_path / "x.db"), busy_timeout_ms=2500)
    assert store.stuck_after == 2.5 + 10
    readme = " ".join(CONFIGURATION.read_text().split())
    protocol = " ".join((ROOT / "docs" / "PROTOCOL.md").read_text().split())
    assert "less than 16 MiB free beside the database" in readme
    assert "`sqlite.busy_timeout` plus 10 s" in readme
    assert "under 16 MiB free beside the database" in protocol
    assert "its busy timeout plus 10 s" in protocol


def _quoted_in_architecture() -> list[str]:
    return sorted(set(_QUOTED.findall(ARCHITECTURE.read_text())))


def _is_path(quoted: str) -> bool:
    return "/" in quoted or quoted.endswith((".py", ".md")) or (ROOT / quoted).is_file()


def test_every_file_the_architecture_page_names_exists() -> None:
    paths = [q for q in _quoted_in_architecture() if _is_path(q)]
    assert "wire/dispatch.py" in paths  # the pattern does find them
    missing = [
        q
        for q in paths
        if "NAME" not in q  # a placeholder, in the how-to sections
        and not any(list(root.glob(q.rstrip("/"))) for root in _PATH_ROOTS)
    ]
    assert not missing, f"docs/ARCHITECTURE.md names files that do not exist: {missing}"


def test_every_code_name_the_architecture_page_quotes_is_in_the_code() -> None:
    sources = " ".join(
        f.read_text()
        for folder in ("sidecar/src", "client/src", "tests")
        for f in (ROOT / folder).rglob("*.py")
    )
    words = set(re.findall(r"[A-Za-z_]\w*", sources))
    quoted = [q for q in _quoted_in_architecture() if not _is_path(q)]
    names = [m.group(1) for q in quoted if (m := _CODE_NAME.match(q))]
    assert "_METHODS" in names  # the pattern does find them
    missing = [n for n in names if not set(n.split(".")) <= words]
    assert not missing, f"docs/ARCHITECTURE.md quotes names the code does not have: {missing}"


def test_no_page_installs_the_unpublished_distributions_from_an_index() -> None:
    """Neither distribution is on a package index: pages install from the checkout."""
    pages = [README, ROOT / "sidecar" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    pages += [ROOT / "systemd" / "README.md", ROOT / "kubernetes" / "README.md"]
    pages += [ROOT / "docs" / "mcp.md", ROOT / "docs" / "langgraph.md"]
    for page in pages:
        text = " ".join(page.read_text().split())
        # A name from an index; `NAME @ git+URL` (a direct reference) is no index's.
        found = re.findall(r"pip install ['\"]?openwop-memory(?:-client)?(?![\w-])(?!\s*@)", text)
        assert not found, (page.name, found)
    guarantees = ROOT / "docs" / "guarantees.md"
    assert "pip install './sidecar[search]'" in " ".join(guarantees.read_text().split())


def test_max_open_runs_is_described_as_evicting_the_least_recently_used_run() -> None:
    """Past it a run is dropped (its next put is ``not_found``), nothing is rate_limited."""
    description = setting_fields()["max_open_runs"].description or ""
    assert "least recently used" in description and "rate_limited" not in description
    protocol = (ROOT / "docs" / "PROTOCOL.md").read_text()
    (row,) = [line for line in protocol.splitlines() if line.startswith("| `--max-open-runs`")]
    assert "least recently used" in row and "rate_limited" not in row
