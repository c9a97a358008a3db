"""The finish of a prepare run: the unit ledger (each finished unit's record, kept by a rerun),
the output folder (locked, checked, its files published meta.json last, units joined by merge,
flatten or mix), meta.json itself, and the publisher of a folder at a URL.

See docs/prepare.md.
"""
