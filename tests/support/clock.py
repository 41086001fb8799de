"""A clock a test moves by hand, for the layers that take one (``SqliteStorage(clock=)``)."""

from __future__ import annotations

from openwop_memory.timefmt import now_us


class ManualClock:
    """µs since the epoch: starts at the wall clock, then moves only when told (never
    back, as a store's clock never goes back)."""

    def __init__(self) -> None:
        self.now = now_us()

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` (> 0) on."""
        assert seconds > 0
        self.now += int(seconds * 1_000_000)
