"""``python -m tokpack.evaluate``: the evaluation sweep's command line (see ``__main__.py``).

The library function is ``tokpack.evaluate`` (defined in ``tokpack.evaluation``); this package
holds only the command, so importing it never shadows the function.
"""
