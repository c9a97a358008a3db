"""Benchmarks: ``python -m tokpack.bench prepare | loader | open | train`` (see ``__main__``).

``timing`` times runs in interleaved rounds, ``prepare`` and ``loops`` hold one function per
printed table, ``peers`` runs the tools users would pick instead, written as their docs use them.

See docs/benchmarks.md.
"""
