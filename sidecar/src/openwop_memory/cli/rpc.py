"""The CLI's one way to a sidecar's socket: finding the path and asking one request.

Standard library only: ``health`` runs every few seconds as a probe (see :mod:`.main`).
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

DEFAULT_SOCKET = "var/openwop-memory.sock"
# Where the systemd install puts the config file `serve` reads (systemd/README.md).
INSTALLED_CONFIG = "/etc/openwop-memory/openwop-memory.toml"
# sun_path holds 108 bytes, the last a NUL.
MAX_SOCKET_PATH_BYTES = 107
PERMISSION_HINT = "is this user in the group openwop-memory (or the socket's group)?"


class ConfigFileError(Exception):
    """The config file a command was told to read (or found installed) is unusable."""


def socket_setting(
    given: str | None, env: str, config: str | None, key: str, *, default: str | None
) -> str | None:
    """A socket path as the CLI's commands look it up: ``given`` (a flag), the variable
    ``env``, the ``key`` of the TOML file ``config`` (else ``OPENWOP_MEMORY_CONFIG``, else
    :data:`INSTALLED_CONFIG` if it exists), else ``default``.

    :raises ConfigFileError: the named config file (or the installed one) cannot be read,
        is not TOML, or its ``key`` is not a path.
    """
    if given:
        return given
    if os.environ.get(env):
        return os.environ[env]
    config = config or os.environ.get("OPENWOP_MEMORY_CONFIG")
    if not config and os.path.exists(INSTALLED_CONFIG):
        config = INSTALLED_CONFIG
    if not config:
        return default
    import tomllib  # only here: a probe given no config file never reads TOML

    try:
        with open(config, "rb") as f:
            value = tomllib.load(f).get(key, default)
    except OSError as exc:
        hint = f" ({PERMISSION_HINT})" if isinstance(exc, PermissionError) else ""
        raise ConfigFileError(f"cannot read config file {config}: {exc.strerror}{hint}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"config file {config} is not valid TOML: {exc}") from None
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigFileError(f"invalid setting {key} (from config file {config}): not a path")
    return value


class ErrorAnswer(Exception):
    """The socket answered with a JSON-RPC error; ``str()`` says which, in one line (its
    code only: an error's message is the sidecar's, not the command's)."""

    def __init__(self, method: str, error: object) -> None:
        code = error.get("code") if isinstance(error, dict) else None
        data = error.get("data") if isinstance(error, dict) else None
        kind = data.get("error") if isinstance(data, dict) else None
        if code == -32601:
            # The admin socket serves the operator's methods only; health and metrics are
            # the workers' socket's.
            text = (
                f"it does not serve {method} (method_not_found): is it the admin socket? "
                "health and metrics ask the workers' socket (--socket)"
            )
        else:
            text = f"it answered {method} with an error ({kind or code})"
        super().__init__(text)


def answer_to(
    socket_path: str, method: str, timeout: float, params: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The answer object (result or error) to one request on the socket at ``socket_path``.

    :raises OSError: no connection or no answer in time.
    :raises ValueError: the answer is not JSON, or not a JSON object.
    """
    request = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(socket_path)
        s.sendall(json.dumps(request).encode() + b"\n")
        with s.makefile("rb") as f:
            answer = json.loads(f.readline())
    if not isinstance(answer, dict):
        raise ValueError("not a JSON-RPC answer")
    return answer


def ask(socket_path: str, method: str, timeout: float, params: dict[str, Any] | None = None) -> Any:
    """The result of one request (``params`` default none).

    :raises OSError: no connection or no answer in time.
    :raises ValueError: the answer is not JSON.
    :raises ErrorAnswer: the answer is an error.
    :raises KeyError: the answer is neither a result nor an error.
    """
    answer = answer_to(socket_path, method, timeout, params)
    if "error" in answer:
        raise ErrorAnswer(method, answer["error"])
    return answer["result"]
