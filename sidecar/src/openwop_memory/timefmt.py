"""Wire times: RFC 3339 UTC with exactly six fractional digits, held internally as integer µs.

Integer microseconds since the epoch are exact, compare as numbers, and their wire text
sorts in time order (PROTOCOL.md, Objects).
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta, timezone

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The last instant the wire format can spell (four-digit years).
MAX_WIRE_US = 253_402_300_799_999_999
_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:([Zz])|([+-])(\d{2}):(\d{2}))$",
    re.ASCII,
)


def now_us() -> int:
    """The wall clock in integer microseconds since the Unix epoch."""
    return time.time_ns() // 1000


# Text up to the fraction, by second (and the date part by day): entries of one answer were
# mostly written in the same few seconds, and a miss costs two divmods and an f-string
# rather than gmtime and strftime. Plain dicts, cleared when full: cheaper than lru_cache
# on a hit, which is what nearly every call is.
_SECONDS: dict[int, str] = {}
_DAYS: dict[int, str] = {}
_MAX_CACHED = 4096


def _prefix(seconds: int) -> str:
    days, second = divmod(seconds, 86_400)
    day = _DAYS.get(days)
    if day is None:
        if len(_DAYS) >= _MAX_CACHED:
            _DAYS.clear()
        day = _DAYS[days] = time.strftime("%Y-%m-%dT", time.gmtime(days * 86_400))
    hours, second = divmod(second, 3600)
    minutes, second = divmod(second, 60)
    if len(_SECONDS) >= _MAX_CACHED:
        _SECONDS.clear()
    prefix = _SECONDS[seconds] = f"{day}{hours:02d}:{minutes:02d}:{second:02d}."
    return prefix


def format_us(us: int) -> str:
    """``2026-11-29T15:21:51.123456Z`` for ``us`` (0 to :data:`MAX_WIRE_US`) µs since the epoch.

    Every entry of every list answer goes through here, and every log line.
    """
    seconds = us // 1_000_000
    prefix = _SECONDS.get(seconds) or _prefix(seconds)
    # Six digits with leading zeros: a seventh digit added and cut off again is cheaper
    # than a format specification.
    return prefix + str(us % 1_000_000 + 1_000_000)[1:] + "Z"


def parse_rfc3339(text: str) -> int:
    """Microseconds since the epoch for an RFC 3339 time with an explicit offset.

    Digits finer than a microsecond are truncated, never rounded up, so the returned
    instant is never later than the one written.

    :raises ValueError: ``text`` is not an RFC 3339 date-time with an offset (``Z`` or
        ``±hh:mm``), names an impossible date or time, or a leap second.
    """
    m = _RFC3339.match(text)
    if m is None:
        raise ValueError("not an RFC 3339 date-time with an offset")
    year, month, day, hour, minute, second = (int(g) for g in m.group(1, 2, 3, 4, 5, 6))
    micro = int((m.group(7) or "0")[:6].ljust(6, "0"))
    if m.group(8):
        tz = UTC
    else:
        oh, om = int(m.group(10)), int(m.group(11))
        if oh > 23 or om > 59:
            raise ValueError("offset out of range")
        sign = -1 if m.group(9) == "-" else 1
        tz = timezone(sign * timedelta(hours=oh, minutes=om))
    dt = datetime(year, month, day, hour, minute, second, micro, tzinfo=tz)
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
