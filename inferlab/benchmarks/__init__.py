"""Benchmarks anyone can rerun: ``python -m inferlab.benchmarks.<name> --help``.

Each prints what it measured and on what; those meant for a GPU refuse politely on a CPU and
record their results, with provenance, in ``data/measurements/``. ``gpu_suite`` runs every
solved lab and every GPU benchmark on a GPU in one command, within eight minutes.
"""
