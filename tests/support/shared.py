"""Tests that share one sidecar process without meeting each other's runs and tenants."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from support.sidecar import RawClient, Sidecar

_prefix_numbers = itertools.count()


class SharedClient(RawClient):
    """A connection to a shared sidecar that keeps each test apart.

    Every ``runId`` and ``tenant`` it sends carries a prefix unique to the test, and comes
    back without it, so tests sharing one process never meet: runs are keyed by id, and
    every scope, plain or issued, belongs to a tenant.
    """

    def __init__(self, path: Path, prefix: str) -> None:
        super().__init__(path)
        self.path = path
        self.prefix = prefix

    @classmethod
    def connect(cls, sidecar: Sidecar) -> SharedClient:
        """A new connection to ``sidecar`` with a prefix no other ``connect`` has handed out
        in this test session."""
        return cls(sidecar.socket, f"s{next(_prefix_numbers)}:")

    def scoped(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` with the prefix put in front of a ``runId`` or ``tenant`` string."""
        return {
            k: self.prefix + v if k in ("runId", "tenant") and isinstance(v, str) else v
            for k, v in params.items()
        }

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """The response, with the prefix taken off ``runId``/``tenant`` in a result object and
        off ``runId`` in an error's details."""
        response = super().request(method, None if params is None else self.scoped(params))
        result = response.get("result")
        if isinstance(result, dict):
            for key in ("runId", "tenant"):
                if isinstance(result.get(key), str):
                    result[key] = result[key].removeprefix(self.prefix)
        details = response.get("error", {}).get("data", {}).get("details")
        if isinstance(details, dict) and isinstance(details.get("runId"), str):
            details["runId"] = details["runId"].removeprefix(self.prefix)
        return response
