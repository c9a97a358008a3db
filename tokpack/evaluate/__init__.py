"""``python -m tokpack.evaluate`` (see ``__main__``); the function ``tokpack.evaluate`` and the sweep
live in ``tokpack.evaluation``. This package holds only the command, so it never shadows the function.
"""
