"""The SQLite backend: one database file in WAL mode, one writer thread with group commit
(``writer``), read connections, FTS5 keyword index written after the put (``keywords``).

Empty on purpose: ``config`` imports ``settings`` of this package, which must not import
the backend itself.
"""
