"""``python -m tokpack.prepare``: the command (see ``tokpack.preparation``).

The library function is ``tokpack.prepare`` (defined in ``tokpack.preparation``); this package
holds only the command, so importing it never shadows the function.
"""
