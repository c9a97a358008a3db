"""``python -m tokpack.tokenizer``: train a tokenizer on a corpus, or compare tokenizers on held-out text.

    python -m tokpack.tokenizer train corpus/ --vocab-size 32768 --out tok/ --max-chars 2e9
    python -m tokpack.tokenizer eval tok/ --inputs val/ --against gpt2 cl100k_base
    python -m tokpack.prepare corpus/ --encoding tok/tokenizer.toml --out-dir data/mine

``train`` needs ``pip install "tokpack[train]"`` (rustbpe, and tokenizers for tokenizer.json).

See docs/tokenizers.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ..cli import add_config_option, parser, run_cli, table
from ..options import add_options, build_config
from .compare import compare
from .train import TrainConfig, summary, train


def main(argv: Sequence[str] | None = None) -> int:
    p = parser("tokenizer", __doc__)
    sub = p.add_subparsers(dest="what", required=True)
    tp = sub.add_parser("train", help="train a byte-level BPE tokenizer (rustbpe) on a corpus")
    tp.add_argument("inputs", nargs="+", help=TrainConfig.__dataclass_fields__["inputs"].metadata["help"])
    add_options(tp, TrainConfig, skip=("inputs",))
    add_config_option(tp)
    ep = sub.add_parser("eval", help="bytes per token and tokens per document of tokenizers on held-out text")
    ep.add_argument("tokenizer", help="a folder train wrote, a spec file, a tokenizer.json, or an encoding name")
    ep.add_argument("--inputs", nargs="+", required=True, help="held-out files, folders or globs")
    ep.add_argument("--against", nargs="*", default=["gpt2"], help="encodings to compare with (default: gpt2)")
    ep.add_argument("--plot", metavar="PNG", help="also draw bytes per token as bars (needs tokpack[plot])")
    args = vars(p.parse_args(argv))

    def body() -> int:
        what = args.pop("what")
        if what == "train":
            config = build_config(TrainConfig, args.pop("config"), {**args, "inputs": tuple(args["inputs"])})
            record = train(config)
            if not config.quiet:
                print(summary(record, Path(config.out)))
            return 0
        if args["plot"]:
            from ..plot import png_path

            png_path(args["plot"])  # a missing extra or a bad name is one line before the work
        rows = compare([args["tokenizer"], *args["against"]], args["inputs"])
        print(table(rows, ["tokenizer", "vocabulary", "documents", "tokens", "bytes/token", "tokens/document",
                           "tokens vs first"]))
        if args["plot"]:
            from ..plot import plot_compression

            plot_compression(rows, args["plot"])
        print(json.dumps({"bench": "tokenizer", "rows": rows}))
        return 0

    return run_cli(body)


if __name__ == "__main__":
    raise SystemExit(main())
