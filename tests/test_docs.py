"""The README's configuration table matches the code: every setting has a row, and the default
it shows is the setting's default (read back through the settings' own validators, so ``7d``,
``"0660"`` and ``{}`` are checked as the sidecar would read them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from openwop_memory.config import GROUPS, Settings, setting_fields

pytestmark = pytest.mark.backend_independent

README = Path(__file__).resolve().parents[1] / "README.md"
# | `name` | `default` ... | meaning |
_ROW = re.compile(r"^\| `([a-z_.]+)` \| ([^|]*) \|")


def documented_defaults() -> dict[str, str]:
    """Setting name → the default cell of its row in the README's configuration table."""
    rows: dict[str, str] = {}
    for line in README.read_text().splitlines():
        match = _ROW.match(line)
        if match:
            rows.setdefault(match.group(1), match.group(2).strip())
    return rows


def test_every_setting_has_a_row() -> None:
    missing = set(setting_fields()) - set(documented_defaults())
    assert not missing, f"settings without a row in README's configuration table: {missing}"


@pytest.mark.parametrize("name", sorted(setting_fields()))
def test_the_documented_default_is_the_real_one(name: str) -> None:
    cell = documented_defaults()[name]
    field = setting_fields()[name]
    shown = re.match(r"`([^`]*)`", cell)
    if field.default is None:
        assert shown is None, f"{name}: the default is unset, the README shows {cell!r}"
        return
    assert shown is not None, f"{name}: no `value` in the default cell {cell!r}"
    group, _, key = name.rpartition(".")
    value = shown.group(1)
    if group:
        parsed = getattr(Settings.model_validate({group: {key: value}}), group)
        assert isinstance(parsed, GROUPS[group])
        assert getattr(parsed, key) == field.default, f"{name}: README shows {value!r}"
    else:
        parsed_value = getattr(Settings.model_validate({name: value}), name)
        assert parsed_value == field.default, f"{name}: README shows {value!r}"


def test_the_documented_health_thresholds_are_the_real_ones(tmp_path: Path) -> None:
    """README and PROTOCOL.md give ``disk_full`` as under 16 MiB free and ``writer_stuck`` as
    a commit in flight past the busy timeout plus 10 s: the constants say the same."""
    from openwop_memory.storage import sqlite

    assert sqlite._LOW_DISK_BYTES == 16 << 20
    store = sqlite.SqliteStorage(str(tmp_path / "x.db"), busy_timeout_ms=2500)
    assert store.stuck_after == 2.5 + 10
    readme = " ".join(README.read_text().split())
    protocol = " ".join((README.parent / "docs" / "PROTOCOL.md").read_text().split())
    assert "less than 16 MiB free beside the database" in readme
    assert "`sqlite.busy_timeout` plus 10 s" in readme
    assert "under 16 MiB free beside the database" in protocol
    assert "its busy timeout plus 10 s" in protocol
