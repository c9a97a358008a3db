"""The write wing: a text corpus into a prepared folder, exact, streaming, parallel. Torch-free.

    python -m tokpack.prepare corpus.txt --out-dir data/corpus
    python -c "from tokpack.prepare import prepare, PrepareConfig; prepare(PrepareConfig(inputs=('corpus.txt',)))"

The tokens of every document are exactly ``encode_ordinary(document)``, whatever the thread
count; pieces are tokenized on all cores and written in input order, so the output is
byte-identical for any ``--workers``. Everything is written to temporary names and renamed when
complete, meta.json last. Nothing here imports torch, except to join torchrun's process group
when ``WORLD_SIZE`` > 1.

See docs/prepare.md.
"""

from .config import GuardOptions, LaunchOptions, PrepareConfig
from .run import prepare

__all__ = ["GuardOptions", "LaunchOptions", "PrepareConfig", "prepare"]
