"""The code blocks of the docs that the tests run as written."""

from __future__ import annotations

import re
from pathlib import Path


def python_block(readme: Path, after: str = "") -> str:
    """The first ```python block of ``readme`` after the line ``after``."""
    text = readme.read_text()
    if after:
        text = text.partition(f"\n{after}\n")[2]
        assert text, f"{readme.name} has no line {after!r}"
    match = re.search(r"^```python\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)
    assert match, f"{readme.name} has no python block after {after!r}"
    return match.group(1)
