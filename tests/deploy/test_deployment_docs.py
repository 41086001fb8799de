"""Every number in systemd/README.md and kubernetes/README.md is the one of the file, unit,
manifest or default it describes.

Each check builds the sentence the page must contain from the real value (a unit's
setting, a manifest's field, a default of :class:`~openwop_memory.config.Settings`) and
looks for it in the page: a page that drifts from what it describes fails, with the
sentence it should say. The measured figures (probe cost, load, security score) are
checked against measurements by tests/deploy/test_deployment.py; the install steps are run by
tests/deploy/test_systemd_install.py.
"""

from __future__ import annotations

import argparse
import configparser
import inspect
import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from openwop_memory.cli import admin as cli_admin
from openwop_memory.cli import transfer as cli_transfer
from openwop_memory.cli.main import _health_parser
from openwop_memory.config import Settings, load_settings
from openwop_memory.server import descriptors_wanted
from openwop_memory.storage.sqlite.backend import SqliteStorage
from openwop_memory.systemd import WORKER_SOCKET_NAMES
from openwop_memory.wire.access_log import CLIENT_ERROR_LINES_PER_SECOND
from openwop_memory_client._async_client import SOCKET_ENV, default_socket_path
from support.deploy_measure import measure_load, measure_probe
from test_deployment import (
    MANIFESTS,
    _documents,
    _env,
    _health_timeout,
    _prose,
    _sidecar,
    import_pod,
)

pytestmark = [pytest.mark.backend_independent]

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "systemd"
KUBERNETES = ROOT / "kubernetes"
# Every setting at its default (model_validate: mypy's plugin would want every field named).
DEFAULTS = Settings.model_validate({})
_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 8: "eight", 10: "ten"}


def _says(page: Path, sentence: str) -> None:
    """``sentence`` is in ``page``, whatever its line breaks and comment markers."""
    assert " ".join(sentence.split()) in _prose(page.read_text()), (
        f"{page.relative_to(ROOT)} should say: {sentence!r}"
    )


def _seconds(value: str) -> float:
    return float(value.removesuffix("s"))


def _g(value: float) -> str:
    return f"{value:g}"


def _unit(name: str) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((SYSTEMD / name).read_text())
    return parser["Socket" if name.endswith(".socket") else "Service"]


def _tmpfiles_mode(path: str) -> str:
    for line in (SYSTEMD / "openwop-memory.tmpfiles").read_text().splitlines():
        fields = line.split()
        if fields[:2] == ["d", path]:
            return fields[2]
    raise AssertionError(f"openwop-memory.tmpfiles makes no {path}")


# -- systemd/README.md -------------------------------------------------------------------


def test_the_systemd_page_quotes_the_units_modes() -> None:
    page = SYSTEMD / "README.md"
    service, socket_unit = _unit("openwop-memory.service"), _unit("openwop-memory.socket")
    config = tomllib.loads((SYSTEMD / "openwop-memory.toml").read_text())
    secrets = _tmpfiles_mode(config["secrets_dir"])
    _says(page, f"| the service only (directory {secrets}) |")
    runtime = _tmpfiles_mode(str(Path(socket_unit["ListenStream"]).parent))
    assert runtime == service["RuntimeDirectoryMode"]
    _says(page, f"(directory {runtime}, socket {socket_unit['SocketMode']}) |")
    _says(
        page,
        f"(directory {service['StateDirectoryMode']}, `UMask={service['UMask']}`) |",
    )


def test_the_systemd_page_quotes_the_watchdog_and_stop_settings(tmp_path: Path) -> None:
    page = SYSTEMD / "README.md"
    service = _unit("openwop-memory.service")
    defaults = DEFAULTS
    watchdog = _seconds(service["WatchdogSec"])
    # Server._watchdog pings every half interval, after a check given a quarter of it.
    _says(
        page,
        f"`WatchdogSec={service['WatchdogSec']}`: the sidecar sends `WATCHDOG=1` every "
        f"{_g(watchdog / 2)} s, each time after a storage health check answered within "
        f"{_g(watchdog / 4)} s",
    )
    _says(page, f"stop the pings, and {_g(watchdog)} s after the last one systemd kills")
    stuck_after = SqliteStorage(str(tmp_path / "m.db")).stuck_after
    beyond = stuck_after - defaults.sqlite.busy_timeout
    _says(page, f"`sqlite.busy_timeout` plus {_g(beyond)} s")
    slowest = defaults.postgresql.connect_timeout + defaults.postgresql.command_timeout
    _says(page, f"`postgresql.command_timeout` ({_g(slowest)} s by default)")
    _says(page, f'"watchdog_seconds":{watchdog!r}')  # the example `ready` log line
    _says(page, f"`drain_timeout` (default {_g(defaults.drain_timeout)} s)")
    _says(page, f"`TimeoutStopSec={service['TimeoutStopSec']}` leaves room for that")
    assert _seconds(service["TimeoutStopSec"]) > 2 * defaults.drain_timeout
    assert service["RestartSec"] == "1s"
    _says(page, "restarts a sidecar that crashed or that the watchdog stopped, after one second")


def test_the_systemd_page_names_the_socket_names_the_sidecar_serves() -> None:
    page = SYSTEMD / "README.md"
    memory, unit_name = WORKER_SOCKET_NAMES
    _says(page, f"it serves the one named `{memory}` (`FileDescriptorName={memory}`)")
    _says(page, f"or `{unit_name}` (a socket unit's default name)")
    assert (SYSTEMD / unit_name).is_file()


def test_the_systemd_page_quotes_the_health_and_log_defaults() -> None:
    page = SYSTEMD / "README.md"
    timeout = _health_parser().parse_args([]).timeout
    _says(page, f"no answer within `--timeout`, default {_g(timeout)} seconds")
    probe_calls = inspect.signature(measure_probe).parameters["calls"].default
    _says(page, f"the quickest of {_WORDS[probe_calls]} calls")
    _says(page, f"errors at most {CLIENT_ERROR_LINES_PER_SECOND} lines a second")
    threshold_ms = DEFAULTS.slow_request_threshold
    assert threshold_ms is not None
    _says(page, f"`slow_request_threshold` ({_g(threshold_ms * 1000)} ms)")
    project = tomllib.loads((ROOT / "sidecar" / "pyproject.toml").read_text())["project"]
    oldest = project["requires-python"].removeprefix(">=")
    _says(page, f"Python {oldest} or newer at `/usr/bin/python3`")


def test_both_pages_say_the_client_reads_the_socket_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client does read it (``MemoryClient()`` with no path connects there)."""
    for page in (SYSTEMD / "README.md", ROOT / "kubernetes" / "README.md"):
        _says(page, f"The client reads `{SOCKET_ENV}`")
        _says(page, "a `MemoryClient()` given no path connects there")
        assert "does not read" not in " ".join(page.read_text().split()), page
    monkeypatch.setenv(SOCKET_ENV, "/run/elsewhere/memory.sock")
    assert default_socket_path() == "/run/elsewhere/memory.sock"


# -- kubernetes/README.md ----------------------------------------------------------------


def _workloads() -> dict[str, dict[str, Any]]:
    found = {}
    for name in MANIFESTS:
        (workload,) = [d for d in _documents(name) if d["kind"] in ("Deployment", "StatefulSet")]
        found[name] = workload
    return found


def _container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    spec = workload["spec"]["template"]["spec"]
    (found,) = [
        c for c in [*spec.get("initContainers", []), *spec["containers"]] if c["name"] == name
    ]
    return dict(found)


def test_the_kubernetes_page_quotes_the_versions_validated() -> None:
    page = KUBERNETES / "README.md"
    native = {tuple(v) for n, v in MANIFESTS.items() if "pre-1.29" not in n}
    assert len(native) == 1
    ((first, second),) = native
    old_first, old_second = MANIFESTS["deployment-pre-1.29.yaml"]
    _says(
        page,
        f"against Kubernetes {first.removesuffix('.0')} and {second.removesuffix('.0')}, and "
        f"{old_first.removesuffix('.0')} and {old_second.removesuffix('.0')} for "
        "`deployment-pre-1.29.yaml`",
    )


def test_the_kubernetes_page_quotes_the_pods_settings() -> None:
    page = KUBERNETES / "README.md"
    workloads = _workloads()
    graces = {
        w["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] for w in workloads.values()
    }
    (grace,) = graces
    _says(page, f"`terminationGracePeriodSeconds: {grace}` is the budget for all of it")
    drains = {_env(_sidecar(w))["OPENWOP_MEMORY_DRAIN_TIMEOUT"] for w in workloads.values()}
    assert drains == {f"{_g(DEFAULTS.drain_timeout)}s"}
    _says(page, f"then the sidecar's drain ({_g(DEFAULTS.drain_timeout)} s by default)")
    contexts = [w["spec"]["template"]["spec"]["securityContext"] for w in workloads.values()]
    (group,) = {c["fsGroup"] for c in contexts}
    assert {(c["runAsUser"], c["runAsGroup"]) for c in contexts} == {(group, group)}
    assert f"USER {group}:{group}" in (ROOT / "Dockerfile").read_text()
    _says(page, f"the Pod's `fsGroup: {group}`")
    _says(page, f"uid and gid {group} (the image's user), `fsGroup: {group}`")
    workers = {_container(w, "worker")["securityContext"]["runAsUser"] for w in workloads.values()}
    (worker,) = workers
    _says(page, f"The worker may run as any uid ({worker} in the example); it is in group {group}")


def test_the_kubernetes_page_quotes_the_probes() -> None:
    page = KUBERNETES / "README.md"
    for name, workload in _workloads().items():
        sidecar = _sidecar(workload)
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = sidecar.get(kind)
            if probe is None:
                continue
            if name == "fleet-postgresql.yaml" and kind == "livenessProbe":
                _says(
                    page,
                    f"the liveness probe's is `--timeout {_g(_health_timeout(probe))}` with "
                    f"`timeoutSeconds: {probe['timeoutSeconds']}`",
                )
                continue
            added = probe["timeoutSeconds"] - _health_timeout(probe)
            _says(
                page,
                f"`timeoutSeconds: {probe['timeoutSeconds']}`: the sidecar's own `--timeout "
                f"{_g(_health_timeout(probe))}`, plus {_g(added)} s",
            )
        startup = sidecar.get("startupProbe")
        if startup is not None:
            assert startup["periodSeconds"] == 1
            total = startup["periodSeconds"] * startup["failureThreshold"]
            _says(page, f"`startupProbe` (every second, up to {total} s)")
        readiness, liveness = sidecar["readinessProbe"], sidecar["livenessProbe"]
        _says(
            page,
            f"{readiness['periodSeconds']} s (readiness) and {liveness['periodSeconds']} s "
            f"(liveness, {_WORDS[liveness['failureThreshold']]} failures)",
        )


def test_the_kubernetes_page_quotes_the_fleet() -> None:
    page = KUBERNETES / "README.md"
    fleet = _workloads()["fleet-postgresql.yaml"]
    env = _env(_sidecar(fleet))
    _says(page, f"is a Deployment of {_WORDS[fleet['spec']['replicas']]} worker Pods")
    pool = env["OPENWOP_MEMORY_POSTGRESQL_POOL_MAX_SIZE"]
    _says(page, f"at most `OPENWOP_MEMORY_POSTGRESQL_POOL_MAX_SIZE` ({pool} here) connections")
    connect = env["OPENWOP_MEMORY_POSTGRESQL_CONNECT_TIMEOUT"].removesuffix("s")
    command = env["OPENWOP_MEMORY_POSTGRESQL_COMMAND_TIMEOUT"].removesuffix("s")
    _says(page, f"Timeouts are shortened ({connect} s to connect, {command} s a statement)")
    liveness = _health_timeout(_sidecar(fleet)["livenessProbe"])
    _says(page, f"the liveness probe waits {_g(liveness)} s, longer than both")


def test_the_kubernetes_page_quotes_the_listeners_bounds() -> None:
    """The metrics policy, the listeners' slots and the descriptor sum the page states are
    the manifests' (every manifest alike), and the fleet's URL is shown verified."""
    page = KUBERNETES / "README.md"
    workloads = _workloads()
    envs = {name: _env(_sidecar(w)) for name, w in workloads.items()}

    def one(variable: str) -> str:
        (value,) = {env[variable] for env in envs.values()}
        return value

    metrics_cap = one("OPENWOP_MEMORY_METRICS_MAX_CONNECTIONS")
    per_uid = one("OPENWOP_MEMORY_MAX_CONNECTIONS_PER_UID")
    total = int(one("OPENWOP_MEMORY_MAX_CONNECTIONS"))
    port = one("OPENWOP_MEMORY_METRICS_ADDRESS").rpartition(":")[2]
    policies = [d for name in MANIFESTS for d in _documents(name) if d["kind"] == "NetworkPolicy"]
    assert len(policies) == len(MANIFESTS)
    (source,) = {
        json.dumps(rule["from"], sort_keys=True) for p in policies for rule in p["spec"]["ingress"]
    }
    (peer,) = json.loads(source)
    ((pod_label, pod_value),) = peer["podSelector"]["matchLabels"].items()
    (namespace,) = peer["namespaceSelector"]["matchLabels"].values()
    _says(
        page,
        f"admits TCP {port} only from Pods labelled `{pod_label}: {pod_value}` in the namespace "
        f"`{namespace}`",
    )
    _says(page, f"`OPENWOP_MEMORY_METRICS_MAX_CONNECTIONS` ({metrics_cap} here) connections")
    wanted = {descriptors_wanted(load_settings({}, environ=env)) for env in envs.values()}
    (sum_,) = wanted
    admin = int(one("OPENWOP_MEMORY_MAX_ADMIN_CONNECTIONS"))
    _says(
        page,
        f"its {total} worker connections (`max_connections`), {metrics_cap} scrapes, "
        f"{admin} admin connections (`max_admin_connections`) and "
        f"{sum_ - total - int(metrics_cap) - admin} of its own (the database, the loop, logs), "
        f"{sum_} in all",
    )
    _says(page, f"Of the {total}, the worker's user holds at most {per_uid}")
    _says(page, "every Pod sets `automountServiceAccountToken: false`")
    shown = re.findall(r"postgresql://\S+?(?=')", page.read_text())
    assert shown and all("sslmode=verify-full&sslrootcert=" in url for url in shown), shown


def test_the_kubernetes_page_quotes_the_resources() -> None:
    page = KUBERNETES / "README.md"
    defaults = DEFAULTS
    for workload in _workloads().values():
        sidecar = _sidecar(workload)
        resources = sidecar["resources"]
        for kind, key in (
            ("requests", "memory"),
            ("limits", "memory"),
            ("requests", "cpu"),
            ("limits", "cpu"),
        ):
            _says(page, f"| `{kind}.{key}` | {resources[kind][key]} |")
        env = _env(sidecar)
        keyrings = int(env["OPENWOP_MEMORY_MAX_KEYRING_MEMORY_BYTES"]) >> 20
        default_keyrings = defaults.max_keyring_memory_bytes >> 20
        _says(page, f"set to {keyrings} MiB here, not the {default_keyrings} MiB default")
        line = defaults.max_request_bytes >> 20
        unsent = defaults.max_unsent_answer_bytes >> 20
        _says(
            page,
            f"{env['OPENWOP_MEMORY_MAX_CONNECTIONS']} connections (`max_connections`, one "
            f"worker per Pod) and {env['OPENWOP_MEMORY_MAX_ADMIN_CONNECTIONS']} admin "
            "connections (`max_admin_connections`) each with a request line "
            f"({line} MiB) and its answers: about "
            f"{3 * unsent} MiB a connection, three times `max_unsent_answer_bytes` ({unsent} MiB)",
        )
    load = inspect.signature(measure_load).parameters
    _says(page, f"under a short mixed load ({load['clients'].default} connections")


def test_the_kubernetes_page_quotes_the_pre_1_29_hooks() -> None:
    page = KUBERNETES / "README.md"
    sidecar = _sidecar(_workloads()["deployment-pre-1.29.yaml"])
    post_start = " ".join(sidecar["lifecycle"]["postStart"]["exec"]["command"])
    tries = re.search(r"-ge (\d+) \]", post_start)
    assert tries is not None, post_start
    _says(page, f"(up to {tries.group(1)} tries)")
    pre_stop = sidecar["lifecycle"]["preStop"]["exec"]["command"]
    _says(page, f"`preStop` hook (`{' '.join(pre_stop)}`)")
    grace = _workloads()["deployment-pre-1.29.yaml"]["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"
    ]
    assert grace > int(pre_stop[-1]) + DEFAULTS.drain_timeout


def _secrets_used(workload: dict[str, Any]) -> set[tuple[str, str | None]]:
    """(Secret name, key) of every Secret ``workload``'s Pods use; key None for a volume."""
    spec = workload["spec"]["template"]["spec"]
    used: set[tuple[str, str | None]] = {
        (v["secret"]["secretName"], None) for v in spec["volumes"] if "secret" in v
    }
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        for variable in container.get("env", []):
            ref = variable.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                used.add((ref["name"], ref["key"]))
    return used


def test_the_kubernetes_page_s_commands_name_what_the_manifests_use() -> None:
    """The Secrets the page creates are the ones the manifests read (by name and key), the
    objects it names exist, and the metrics port it describes is every manifest's."""
    page = KUBERNETES / "README.md"
    text = _prose(page.read_text())
    created = re.findall(
        r"kubectl create secret generic (\S+) (?:\\ )?--from-(?:literal|file)=(\w+)", text
    )
    assert created, "kubernetes/README.md no longer creates a Secret"
    workloads = _workloads()
    used = set().union(*(_secrets_used(w) for w in workloads.values()))
    for name, key in created:
        assert (name, key) in used or (name, None) in used, (name, key, used)
    assert {n for n, _ in used} == {n for n, _ in created}, "a Secret the page never creates"
    for kind, name in re.findall(r"kubectl rollout status (\w+)/([\w-]+)", text):
        assert any(
            w["kind"].lower() == kind and w["metadata"]["name"] == name for w in workloads.values()
        ), (kind, name)
    assert re.findall(r"kubectl (?:exec|logs) \S+ -c (\w+)", text) != []
    for container in re.findall(r"kubectl (?:exec|logs) \S+ -c (\w+)", text):
        assert container == "memory"
    address = re.search(r"`OPENWOP_MEMORY_METRICS_ADDRESS=([\d.]+:(\d+))`", text)
    assert address is not None
    for workload in workloads.values():
        sidecar = _sidecar(workload)
        assert _env(sidecar)["OPENWOP_MEMORY_METRICS_ADDRESS"] == address.group(1)
        assert {"name": "metrics", "containerPort": int(address.group(2))} in sidecar["ports"]
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == address.group(2)


# -- kubernetes/README.md: the operator's commands ----------------------------------------

_OPERATOR_COMMANDS = ("inspect", "backup", "forget", "export", "import")


def _fenced(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def _operator_command_lines(text: str) -> list[list[str]]:
    """The arguments after ``openwop-memory`` of every operator command in the page's
    shell blocks, up to the end of the shell command (``;``, ``|``, ``>``, ``#``)."""
    found = []
    for block in _fenced(text, "sh"):
        for match in re.finditer(
            rf"openwop-memory ((?:{'|'.join(_OPERATOR_COMMANDS)})\b[^;|&>#\n]*)", block
        ):
            found.append(shlex.split(match.group(1)))
    return found


def _parse(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed by the parser ``openwop-memory`` hands it to; AssertionError when
    that parser refuses it (an unknown flag, a missing argument)."""
    parser = cli_transfer._parser() if argv[0] in ("export", "import") else cli_admin._parser()
    try:
        return parser.parse_args(argv)
    except SystemExit:
        raise AssertionError(f"openwop-memory {' '.join(argv)} is refused by its parser") from None


def test_the_kubernetes_page_runs_every_operator_command_in_the_sidecar_container() -> None:
    """Each of inspect, backup, forget, export and import is shown run in a Pod with
    arguments its parser accepts, and with no --admin-socket or --database: the sidecar
    container's environment names both (the manifests set them)."""
    page = KUBERNETES / "README.md"
    text = page.read_text()
    commands = _operator_command_lines(text)
    assert {argv[0] for argv in commands} == set(_OPERATOR_COMMANDS), commands
    for argv in commands:
        args = _parse(argv)
        assert getattr(args, "admin_socket", None) is None, argv
        assert getattr(args, "database", None) is None, argv
    for block in _fenced(text, "sh"):
        for line in block.splitlines():
            if re.search(rf"openwop-memory (?:{'|'.join(_OPERATOR_COMMANDS)})\b", line):
                assert re.search(r"kubectl exec \S+ -c memory -- openwop-memory ", line), line
    for workload in _workloads().values():
        env = _env(_sidecar(workload))
        assert env["OPENWOP_MEMORY_ADMIN_SOCKET"] in text
    _says(
        page,
        "At most `OPENWOP_MEMORY_MAX_ADMIN_CONNECTIONS` "
        f"({_env(_sidecar(_workloads()['deployment.yaml']))['OPENWOP_MEMORY_MAX_ADMIN_CONNECTIONS']}"
        " here) commands at once",
    )


def test_the_kubernetes_page_forgets_in_every_pod_of_the_statefulset() -> None:
    """forget is shown in a loop over the StatefulSet's Pods (by its Pods' label), the
    retained claims of scaled-down Pods are named, and the fleet runs it once."""
    page = KUBERNETES / "README.md"
    statefulset = _workloads()["statefulset.yaml"]
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    ((key, value),) = labels.items()
    loops = [
        block
        for block in _fenced(page.read_text(), "sh")
        if re.search(rf"for pod in \$\(kubectl get pods -l {key}={value} -o name\)", block)
    ]
    (loop,) = loops
    assert 'kubectl exec "$pod" -c memory -- openwop-memory forget ' in loop
    retention = statefulset["spec"]["persistentVolumeClaimRetentionPolicy"]["whenScaled"]
    (template,) = statefulset["spec"]["volumeClaimTemplates"]
    replicas = statefulset["spec"]["replicas"]
    name = statefulset["metadata"]["name"]
    _says(page, f"The claims outlive a scale-down (`whenScaled: {retention}`)")
    _says(
        page,
        f"(`{template['metadata']['name']}-{name}-{replicas}` after scaling down to {replicas}) "
        "still holds its entries",
    )
    _says(page, "every Pod shares one database: run it once, in any Pod")


def test_the_kubernetes_page_s_import_pod_matches_the_manifest() -> None:
    """The one-off Pod the page imports in validates offline, runs the sidecar's image as
    its user, mounts the claim ``deployment.yaml`` names at the same path, and gives the
    import the settings a put of the sidecar applies (so imported entries are redacted as
    the workers' are); the claim it names for a StatefulSet Pod is that Pod's."""
    page = KUBERNETES / "README.md"
    text = page.read_text()
    pod = import_pod()
    versions = {v for n, vs in MANIFESTS.items() if "pre-1.29" not in n for v in vs}
    for version in sorted(versions):
        kubernetes_validate.validate(pod, version, strict=True)
    documents = _documents("deployment.yaml")
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    sidecar = _sidecar(deployment)
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    template = deployment["spec"]["template"]["spec"]
    for key in ("runAsUser", "runAsGroup", "fsGroup"):
        assert spec["securityContext"][key] == template["securityContext"][key], key
    (container,) = spec["containers"]
    assert container["image"] == sidecar["image"]
    env = _env(container)
    sidecar_env = _env(sidecar)
    for variable in (
        "OPENWOP_MEMORY_DATABASE",
        "OPENWOP_MEMORY_REDACTION",
        "OPENWOP_MEMORY_SECRETS_DIR",
        "OPENWOP_MEMORY_MAX_KEYRING_MEMORY_BYTES",
        "OPENWOP_MEMORY_CREDENTIAL_PATTERNS",
        "OPENWOP_MEMORY_MAX_ENTRY_SIZE_BYTES",
    ):
        assert env.get(variable) == sidecar_env.get(variable), variable
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    sidecar_mounts = {m["mountPath"]: m["name"] for m in sidecar["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    sidecar_volumes = {v["name"]: v for v in template["volumes"]}
    for path in ("/var/lib/openwop-memory", sidecar_env["OPENWOP_MEMORY_SECRETS_DIR"]):
        assert volumes[mounts[path]] == sidecar_volumes[sidecar_mounts[path]], path
    (claim,) = [d for d in documents if d["kind"] == "PersistentVolumeClaim"]
    assert f"for `deployment.yaml` it is `{claim['metadata']['name']}`" in _prose(text)
    statefulset = _workloads()["statefulset.yaml"]
    (claims,) = statefulset["spec"]["volumeClaimTemplates"]
    _says(
        page,
        f"the claim of Pod `{statefulset['metadata']['name']}-N` is "
        f"`{claims['metadata']['name']}-{statefulset['metadata']['name']}-N`",
    )
    # The workload is stopped first, and the Pod's name is the one the commands use.
    steps = "\n".join(_fenced(text, "sh"))
    assert "kubectl scale deployment/agent-worker --replicas=0" in steps
    assert f"kubectl exec {pod['metadata']['name']} -c memory -- openwop-memory import" in steps
