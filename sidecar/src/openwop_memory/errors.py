"""The error that stops a sidecar from starting, shared by the server and :mod:`.app`."""

from __future__ import annotations


class StartupError(Exception):
    """The sidecar cannot start; the message says why (and touches nothing it should not)."""
