"""The parts of jsonrpcserver the dispatcher uses, loaded without its package ``__init__``.

Why: ``jsonrpcserver/__init__.py`` imports ``jsonrpcserver.main``, which imports jsonschema
and builds a JSON Schema validator at import time, for its ``dispatch`` functions. The
sidecar never calls those (see :mod:`.dispatch`), yet importing any submodule the normal
way runs the package ``__init__`` first. jsonschema is most of what that import costs, in
idle memory and in start-up time, which ``make bench`` reports beside the floor of the
libraries alone; no other import of the sidecar's costs as much, so it is worth one
documented trick.

How: while the submodules load, ``sys.modules["jsonrpcserver"]`` is the package's module
object made from its own spec but not executed (so relative imports between submodules
resolve to the real files); then that placeholder and every ``jsonrpcserver.*`` module it
loaded are taken out of ``sys.modules`` again. The objects exported here stay usable (the
modules they live in are kept alive by them) and agree with each other: ``call`` catches
the ``JsonRpcError`` exported here. Anyone importing jsonrpcserver later, normally, gets a
complete package of their own, untouched by this. If jsonrpcserver is already imported
when this module runs, its objects are used as they are.

What would break it, and is tested (tests/test_lean_imports.py): a jsonrpcserver release
whose ``dispatcher``/``async_dispatcher`` import ``main`` or jsonschema (the memory is
back: the test sees jsonschema in ``sys.modules``), or one that renames or moves these
names (the import fails at start-up, loudly). The dependency is pinned below 6.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import TYPE_CHECKING

from oslash.either import Left

_PACKAGE = "jsonrpcserver"
# Loaded in this order; each imports only its siblings, never the package itself.
_SUBMODULES = ("sentinels", "exceptions", "result", "dispatcher", "async_dispatcher")


def _load_submodules() -> dict[str, ModuleType]:
    """jsonrpcserver's submodules by short name, without running the package ``__init__``.

    :raises ImportError: jsonrpcserver is not installed or lacks one of the submodules.
    """
    if _PACKAGE in sys.modules:  # already imported in full: nothing left to save
        return {name: importlib.import_module(f"{_PACKAGE}.{name}") for name in _SUBMODULES}
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError(f"{_PACKAGE} is not installed as a package")
    sys.modules[_PACKAGE] = importlib.util.module_from_spec(spec)  # not executed
    try:
        return {name: importlib.import_module(f"{_PACKAGE}.{name}") for name in _SUBMODULES}
    finally:
        for loaded in [m for m in sys.modules if m == _PACKAGE or m.startswith(_PACKAGE + ".")]:
            del sys.modules[loaded]


if TYPE_CHECKING:
    from jsonrpcserver.async_dispatcher import call
    from jsonrpcserver.dispatcher import call as call_at_once
    from jsonrpcserver.dispatcher import create_request, to_response
    from jsonrpcserver.exceptions import JsonRpcError
    from jsonrpcserver.result import Success
    from jsonrpcserver.sentinels import NOID
else:
    _modules = _load_submodules()
    call = _modules["async_dispatcher"].call
    call_at_once = _modules["dispatcher"].call
    create_request = _modules["dispatcher"].create_request
    to_response = _modules["dispatcher"].to_response
    JsonRpcError = _modules["exceptions"].JsonRpcError
    Success = _modules["result"].Success
    NOID = _modules["sentinels"].NOID
    del _modules

__all__ = [
    "NOID",
    "JsonRpcError",
    "Left",
    "Success",
    "call",
    "call_at_once",
    "create_request",
    "to_response",
]
