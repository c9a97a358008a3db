"""The finish of a prepare run, and where its units go: the unit ledger (each finished unit's
record, kept by a rerun), the sinks a run writes into (``sink.Sink``: the output folder itself,
``folder.LocalSink``, or a folder at a URL, ``remote.Publisher``), the output folder (locked,
checked, its files published meta.json last, units joined by merge, flatten or mix) and
meta.json itself.

See docs/prepare.md.
"""
