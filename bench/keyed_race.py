"""32 writers racing on one key by compare-and-set for 10 s (issue 24): 0 lost updates.

Not in the gating suite (tests/e2e/test_keyed.py races for 1.5 s). Run it with
``.venv/bin/python bench/keyed_race.py [--seconds 10] [--backend sqlite|postgresql]``;
it prints one table row and exits 1 if an acknowledged revision is missing from the
history or a refusal was not a ``conflict`` (the race asserts both).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))

from support import backends
from support.protocol import issue
from support.shared import SharedClient
from support.sidecar import Sidecar
from test_keyed import WRITERS, race


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--backend", default="sqlite", choices=sorted(backends.BACKENDS))
    args = parser.parse_args()
    backends.select(args.backend)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="owm-race-") as tmp,
            Sidecar(Path(tmp)) as s,
            SharedClient.connect(s) as c,
        ):
            started = time.monotonic()
            acknowledged, refused = race(c, issue(c), "counter", args.seconds)
            took = time.monotonic() - started
    finally:
        backends.POSTGRES.close()
    print("| backend | writers | seconds | acknowledged | refused (conflict) | lost |")
    print("|---|---|---|---|---|---|")
    print(f"| {args.backend} | {WRITERS} | {took:.1f} | {acknowledged} | {refused} | 0 |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
