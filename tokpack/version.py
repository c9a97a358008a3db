"""tokpack's version: recorded in every meta.json, and the package's ``__version__``."""

__version__ = "0.2.0"
