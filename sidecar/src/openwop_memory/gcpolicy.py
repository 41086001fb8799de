"""The cyclic garbage collector's settings for a server that has finished starting.

Two costs of the collector on a busy sidecar (its time per request shows in
``gc.callbacks``, and in the CPU per request ``make bench`` reports):

* Everything alive once start-up is over (modules, classes, pydantic validators, the
  service and its storage) lives as long as the process, yet every full collection scans
  it again. ``gc.freeze()`` moves it out of the collector's sight, which takes most of the
  cost out of full collections.
* With the default young-generation threshold (700), a collection starts whenever 700
  more container objects exist than at the last one: with a few dozen requests in flight
  that is every few hundred requests, and each collection scans, then promotes to the
  older generations, the objects of requests still running, which later collections scan
  again. With :data:`YOUNG_THRESHOLD` a request's objects are almost always freed by
  reference counting, when the request ends, before any collection sees them. The cost is
  a bound, not a leak: at most that many objects of unreachable cycles wait longer to be
  freed.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000


def settle_after_startup() -> None:
    """Freeze what start-up built and raise the young-generation threshold.

    Call once, after start-up built its long-lived objects and before serving; later
    collections never scan (nor free) what was alive at that moment.
    """
    gc.freeze()
    young, middle, old = gc.get_threshold()
    if young != 0:  # 0: someone disabled automatic collection on purpose; leave it so
        gc.set_threshold(max(young, YOUNG_THRESHOLD), middle, old)
