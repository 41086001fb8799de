"""Value types the settings of every layer share: durations as seconds.

A leaf: the daemon's settings (``config``) and each storage backend's own group import it,
so a backend's settings never import ``config``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def duration(value: Any) -> Any:
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m is None:
            raise ValueError("expected seconds or a duration such as 500ms, 60s, 5m, 2h, 7d")
        return float(m.group(1)) * UNITS[m.group(2)]
    return value


Seconds = Annotated[float, BeforeValidator(duration), Field(gt=0)]
# A duration where 0 switches the thing off.
SecondsOrOff = Annotated[float, BeforeValidator(duration), Field(ge=0)]
