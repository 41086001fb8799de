"""The deployment pages' time figures, measured: what the health probe costs and the
sidecar's CPU per request under a short mixed load (tests/support/deploy_measure.py), each
against the figure systemd/, kubernetes/ and the Dockerfile quote (within 2x: a target of
this report, not a gate of the test suite, where a busy machine made it fail). The memory
figures stay checked by tests/deploy/test_deployment.py (memory does not wait for a CPU).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from support.deploy_measure import LoadFigures, ProbeCost, measure_load, measure_probe
from support.sidecar import Sidecar
from test_deployment import documented_load, probe_costs_quoted

from bench.report import Metric, SuiteResult, Target


def _measure(workdir: Path) -> tuple[ProbeCost, LoadFigures]:
    # As the image runs it: no search extra (no embedding model).
    with Sidecar(workdir, "--semantic-search=false", measured=False) as sidecar:
        return measure_probe(sidecar.socket), measure_load(sidecar)


async def run(workdir: Path) -> SuiteResult:
    """The suite, for ``bench/run.py``."""
    probe, load = await asyncio.to_thread(_measure, workdir)
    ((wall, cpu),) = {q for figures in probe_costs_quoted().values() for q in figures}
    _, cpu_us = documented_load()
    return SuiteResult(
        metrics=[
            Metric(
                "deployment: health probe wall time (quickest of 10)",
                probe.wall,
                "s",
                Target("<=", 2 * float(wall), f"(2x the quoted {wall} s)"),
            ),
            Metric(
                "deployment: health probe CPU (median of 10)",
                probe.cpu,
                "s",
                Target("<=", 2 * float(cpu), f"(2x the quoted {cpu} s)"),
            ),
            Metric(
                "deployment: CPU per request, 8 clients put/get/list",
                load.cpu_us_per_request,
                "us",
                Target("<=", 2 * cpu_us, f"(2x the quoted {cpu_us:g} us)"),
            ),
            Metric(
                "deployment: CPU off the event loop's thread", 100 * load.other_threads_share, "%"
            ),
            Metric("deployment: peak RSS under that load", load.peak_rss_mib, "MiB"),
        ]
    )
