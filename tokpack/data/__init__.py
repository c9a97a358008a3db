"""The read wing: datasets, samplers and the loader, from prepared token files to training batches.

    python -m tokpack.check data/sample      # the loaders over a folder: reproducible, resumable, rank-exact

``windows`` (TokenWindows), ``documents``, ``packing`` (PackedDocuments), ``mixing`` and
``streams`` are the datasets; ``samplers`` and ``permutation`` decide the order; ``loader`` builds
the resumable DataLoader; ``runtime`` holds what a process needs to know about where it runs. The public names are
re-exported by ``tokpack``.

See docs/loading.md.
"""
