"""Benchmarks anyone can rerun: ``python -m inferlab.benchmarks.<name> --help``.

Each prints what it measured and on what; those meant for a GPU refuse politely on a CPU and
record their results, with provenance, in ``data/measurements/``.
"""
