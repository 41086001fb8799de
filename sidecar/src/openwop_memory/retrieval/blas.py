"""numpy's BLAS on one thread: search runs its products on threads of its own.

OpenBLAS's own threads cost more than they save on the products search runs: on this
project's 2-core machine, a scope's product (100,000 rows of 384, when it was widened to
float32 for BLAS) took 9.9 ms with its two threads and 6.5 ms with one, and
all-MiniLM-L6-v2's forward pass took as long on one as on two. Its threads would also take
the cores from the event loop while they spin. So BLAS runs each product on the thread
that asked for it, and the vector cache decides which threads score a scope
(:func:`~openwop_memory.retrieval.nearest.VectorCache.nearest`; its int8 product is
SimSIMD's, not BLAS's).

The encoders used to set ``OPENBLAS_NUM_THREADS`` when imported, which OpenBLAS reads only
when numpy first loads it: whenever the vector cache's module imported numpy first, the
setting came too late, and the product ran on OpenBLAS's threads. threadpoolctl limits the
library once loaded, whichever vendor numpy was built with.
"""

from __future__ import annotations

from functools import cache


@cache
def one_thread_per_product() -> None:
    """Limit every BLAS library loaded in the process to one thread (once; numpy is
    imported first, since only a library already loaded can be limited). A setting of the
    whole process: in the sidecar, search is the only user of BLAS.

    :raises ImportError: numpy or threadpoolctl is not installed (the ``search`` extra).
    """
    import numpy  # noqa: F401  # loads the BLAS library that is then limited
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")
