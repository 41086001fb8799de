"""The PostgreSQL backend: many sidecars on one database, through an asyncpg pool.

Empty on purpose: ``config`` imports ``settings`` of this package, which must not import
the driver (the optional extra ``openwop-memory[postgresql]``).
"""
