"""Fresh identifiers for tenants, runs and refs."""

from __future__ import annotations

import uuid


def uid(prefix: str = "r") -> str:
    """``prefix``, a dash and 12 random hex digits: a name no other test uses, so tests
    sharing one sidecar never see each other's tenants or runs."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"
