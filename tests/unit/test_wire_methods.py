"""The typed method table's contract (wire/methods.py), in process."""

from __future__ import annotations

from collections.abc import Coroutine

import pytest
from openwop_memory.domain import NOT_NOW, NotNow
from openwop_memory.wire.methods import AnyMethod, Method, bind
from pydantic import BaseModel, field_validator

pytestmark = pytest.mark.backend_independent


class _Params(BaseModel):
    key: str

    @field_validator("key")
    @classmethod
    def _count(cls, value: str) -> str:
        _SEEN.append(value)
        return value


_SEEN: list[str] = []


class _Target:
    def __init__(self, ready: bool) -> None:
        self.ready = ready
        self.calls: list[str] = []

    def now(self, p: _Params) -> str | NotNow:
        self.calls.append("now")
        return "at once" if self.ready else NOT_NOW

    async def later(self, p: _Params) -> str:
        self.calls.append("later")
        return "later"

    async def full(self, p: _Params) -> str:
        self.calls.append("full")
        return "full"


_TABLE: dict[str, AnyMethod[_Target]] = {
    "m": Method(
        _Params, lambda t, p: t.full(p), now=lambda t, p: t.now(p), later=lambda t, p: t.later(p)
    )
}


@pytest.mark.anyio
async def test_a_fallback_validates_once_and_tries_the_at_once_form_once() -> None:
    """What memory.get relies on: NOT_NOW from ``now`` leads to ``later`` with the params
    validated once, and ``now`` is not tried again."""
    _SEEN.clear()
    target = _Target(ready=False)
    start_now = bind(_TABLE, target)["m"].start_now
    assert start_now is not None
    pending = start_now({"key": "k"}, None)
    assert isinstance(pending, Coroutine)
    assert await pending == "later"
    assert (target.calls, _SEEN) == (["now", "later"], ["k"])


def test_an_answer_at_once_calls_nothing_else() -> None:
    _SEEN.clear()
    target = _Target(ready=True)
    start_now = bind(_TABLE, target)["m"].start_now
    assert start_now is not None
    assert start_now({"key": "k"}, None) == "at once"
    assert (target.calls, _SEEN) == (["now"], ["k"])


@pytest.mark.anyio
async def test_the_waiting_form_alone_runs_the_handler() -> None:
    target = _Target(ready=True)
    pending = bind(_TABLE, target)["m"].start({"key": "k"}, None)
    assert isinstance(pending, Coroutine)
    assert await pending == "full"
    assert target.calls == ["full"]
