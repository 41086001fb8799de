"""Waiting for a condition by polling, with a deadline (no test asserts a speed)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Return once ``predicate()`` is true; AssertionError naming ``what`` after ``timeout``
    seconds. Polls every 5 ms."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)


def eventually(probe: Callable[[], T | None], timeout: float = 5.0) -> T:
    """The first non-None result of ``probe``, polled until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)
