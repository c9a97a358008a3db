"""``python -m tokpack.evaluate``: the evaluation sweep (the library is ``tokpack.evaluation``)."""

from tokpack.evaluation import main

if __name__ == "__main__":
    raise SystemExit(main())
