"""Benchmarks of openwop-memory: ``make bench`` runs :mod:`bench.run`, which runs every suite."""
