"""The in-memory backend (``memory://NAME``): every database a Python structure of this
process, nothing written to disk; see :mod:`.backend`.

Empty on purpose: ``config`` imports ``settings`` of this package, which must not import
the backend itself.
"""
