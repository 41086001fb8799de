"""The method tables' type: each method's params model and what it calls on its target.

Typed end to end so that mypy checks every handler against the target's real methods: a
renamed or re-typed service method is a type error in the table, not a runtime surprise.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import pydantic
from openwop_memory_client import ForbiddenError

from ..domain import NotNow
from .tenant_binding import permits

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)
P = TypeVar("P", bound=pydantic.BaseModel)


class AnyMethod(Protocol[T_contra]):
    """A method of a table, whatever its params model (what the dispatcher sees)."""

    @property
    def answers_now(self) -> bool:
        """Whether :meth:`start_now` may answer without waiting."""
        ...

    def start(
        self, target: T_contra, params: dict[str, object], tenants: frozenset[str] | None
    ) -> object:
        """The method's result, or a coroutine making it.

        :raises pydantic.ValidationError: the params do not fit the method's model.
        :raises ForbiddenError: ``tenants`` is given and the params name another tenant.
        """
        ...

    def start_now(
        self, target: T_contra, params: dict[str, object], tenants: frozenset[str] | None
    ) -> object:
        """As :meth:`start`, trying the method's answer-at-once form first: its result, or
        (when that must wait after all) a coroutine making it from the params validated
        once, without trying the at-once form again."""
        ...


@dataclass(frozen=True, slots=True)
class Method(Generic[T, P]):
    """``handler(target, params)`` makes the answer (a value, or a coroutine making it).

    ``now``, when given, is the form that may answer without waiting: a value, or
    ``NOT_NOW``, after which ``later`` (default ``handler``) makes the answer.
    """

    params: type[P]
    handler: Callable[[T, P], object]
    now: Callable[[T, P], object] | None = None
    later: Callable[[T, P], object] | None = None

    @property
    def answers_now(self) -> bool:
        return self.now is not None

    def _validated(self, params: dict[str, object], tenants: frozenset[str] | None) -> P:
        validated = self.params.model_validate(params)
        if tenants is not None:
            tenant = getattr(validated, "tenant", None)
            if isinstance(tenant, str) and not permits(tenants, tenant):
                raise ForbiddenError("this process may not use that tenant", {"resource": "tenant"})
        return validated

    def start(self, target: T, params: dict[str, object], tenants: frozenset[str] | None) -> object:
        return self.handler(target, self._validated(params, tenants))

    def start_now(
        self, target: T, params: dict[str, object], tenants: frozenset[str] | None
    ) -> object:
        validated = self._validated(params, tenants)
        now = self.now if self.now is not None else self.handler
        answer = now(target, validated)
        if isinstance(answer, NotNow):
            return (self.later or self.handler)(target, validated)
        return answer


MethodTable = Mapping[str, AnyMethod[T]]


@dataclass(frozen=True, slots=True)
class Bound:
    """A method bound to its target: what a :class:`~.dispatch.Dispatcher` calls.
    ``start_now`` is ``None`` for a method with no answer-at-once form."""

    start: Callable[[dict[str, object], frozenset[str] | None], object]
    start_now: Callable[[dict[str, object], frozenset[str] | None], object] | None


def bind(methods: MethodTable[T], target: T) -> dict[str, Bound]:
    """The table's methods bound to ``target`` (mypy checks the two agree)."""
    return {
        name: Bound(
            functools.partial(method.start, target),
            functools.partial(method.start_now, target) if method.answers_now else None,
        )
        for name, method in methods.items()
    }
