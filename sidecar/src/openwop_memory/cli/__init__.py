"""The ``openwop-memory`` command: ``serve``, the probes (``health``, ``metrics``), the
operator's commands (:mod:`.admin`) and ``export``/``import`` (:mod:`.transfer`).

Modules: :mod:`.main` parses the command line and serves; :mod:`.rpc` finds a socket and
asks it one request (the one raw-socket client of the CLI); :mod:`.admin` and
:mod:`.transfer` are imported only by their own commands. This package imports nothing
itself, so the probe's path stays the standard library's.
"""
