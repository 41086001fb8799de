"""Settings: defaults < TOML file < ``OPENWOP_MEMORY_*`` environment < command-line flags.

Every setting has one name, spelt ``max_request_bytes`` in TOML,
``OPENWOP_MEMORY_MAX_REQUEST_BYTES`` in the environment and ``--max-request-bytes`` on the
command line. Durations take seconds or a number with a unit (``500ms``, ``60s``, ``5m``,
``2h``, ``7d``). A bad value fails start-up with a message naming the setting and where
it came from.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

ENV_PREFIX = "OPENWOP_MEMORY_"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


class ConfigError(Exception):
    """A setting is invalid; the message names it and its source."""


def _duration(value: Any) -> Any:
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m is None:
            raise ValueError("expected seconds or a duration such as 500ms, 60s, 5m, 2h, 7d")
        return float(m.group(1)) * _UNITS[m.group(2)]
    return value


def _octal_mode(value: Any) -> Any:
    # A mode is octal; in TOML write "0660" or 0o660 (a bare 660 is a decimal integer).
    if isinstance(value, str):
        if not re.fullmatch(r"0?o?[0-7]{3,4}", value.strip()):
            raise ValueError('expected an octal file mode such as "0660" or 0o660')
        value = int(value.strip().replace("o", ""), 8)
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value <= 0o777:
            raise ValueError('expected an octal file mode such as "0660" or 0o660')
        if value & 0o600 != 0o600:
            raise ValueError("the owner needs read and write permission on the socket")
    return value


Seconds = Annotated[float, BeforeValidator(_duration), Field(gt=0)]


class Settings(BaseModel):
    """All settings of ``openwop-memory serve``, with their defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    socket: str = Field("var/openwop-memory.sock", min_length=1)
    database: str = Field("sqlite:///var/openwop-memory.db", pattern=r"^(sqlite|postgresql)://")
    redaction: Literal["rewrite", "reject", "reject-disguised"] = Field(
        "rewrite",
        description="when an entry holds a secret: rewrite it as [REDACTED:<id>], reject the "
        "put, or rewrite plain occurrences and reject disguised ones",
    )
    credential_patterns: Literal["off", "rewrite", "reject"] = Field(
        "rewrite",
        description="well-known credential formats no run registered: off, rewrite or reject",
    )
    secrets_dir: str | None = Field(
        None,
        min_length=1,
        description="directory of host secrets redacted for every run: DIR/<secretId> for "
        "all tenants, DIR/tenants/<tenant>/<secretId> for one; re-read on change and SIGHUP",
    )
    secrets_poll_interval: Seconds = Field(
        2.0, description="how often secrets_dir is checked for changes"
    )
    socket_mode: Annotated[int, BeforeValidator(_octal_mode)] = 0o660
    max_request_bytes: int = Field(1 << 20, ge=1024, le=64 << 20)
    max_entry_size_bytes: int = Field(65536, ge=1, le=16 << 20)
    drain_timeout: Seconds = 10.0
    sweep_interval: Seconds = 60.0
    sweep_batch: int = Field(500, ge=1, le=100_000)
    replay_retention: Seconds = 7 * 86400.0
    synchronous: Literal["NORMAL", "FULL", "EXTRA"] = "NORMAL"
    busy_timeout: Seconds = 5.0
    read_connections: int = Field(2, ge=1, le=64)
    inline_point_reads: bool = True
    max_open_runs: int = Field(10_000, ge=1)
    scope_cache_size: int = Field(
        4096,
        ge=1,
        description="scope ids kept in memory (about 200 bytes each); a miss costs one "
        "indexed lookup when writing",
    )
    max_inflight: int = Field(4096, ge=1)
    log_format: Literal["json", "console"] = "json"
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    def sqlite_path(self) -> str:
        """The file path of a ``sqlite:///path`` URL (``sqlite:////abs`` for absolute)."""
        return self.database.removeprefix("sqlite://").removeprefix("/")


def setting_names() -> list[str]:
    return list(Settings.model_fields)


def load_settings(
    flags: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
    config_file: str | None = None,
) -> Settings:
    """Merge the sources and validate.

    :param flags: values given on the command line (``None`` values are ignored).
    :raises ConfigError: a value is invalid, a TOML key is unknown, or the file is unreadable.
    """
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    config_file = config_file or environ.get(ENV_PREFIX + "CONFIG")
    if config_file:
        try:
            with open(config_file, "rb") as f:
                data = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {config_file}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {config_file} is not valid TOML: {exc}") from None
        for key, value in data.items():
            if key not in Settings.model_fields:
                raise ConfigError(f"unknown setting {key!r} in config file {config_file}")
            values[key], sources[key] = value, f"config file {config_file}"
    for name in Settings.model_fields:
        env = ENV_PREFIX + name.upper()
        if env in environ:
            values[name], sources[name] = environ[env], f"environment {env}"
    for name, value in flags.items():
        if value is not None:
            values[name], sources[name] = value, f"flag --{name.replace('_', '-')}"
    try:
        settings = Settings.model_validate(values)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        name = str(first["loc"][0]) if first["loc"] else "settings"
        raise ConfigError(
            f"invalid setting {name} (from {sources.get(name, 'defaults')}): {first['msg']}"
        ) from None
    if settings.replay_retention <= 2 * settings.sweep_interval:
        raise ConfigError(
            f"invalid setting replay_retention (from {sources.get('replay_retention', 'defaults')})"
            ": it must be more than twice sweep_interval (from "
            f"{sources.get('sweep_interval', 'defaults')}), so open runs are kept alive before "
            "their snapshots could expire"
        )
    return settings
