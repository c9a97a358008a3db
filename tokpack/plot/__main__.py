"""``python -m tokpack.plot RUN_DIR``: the loss figure of a scripts/train_gpt.py run.

    python -m tokpack.plot out/sample                     # out/sample/losses.png
    python -m tokpack.plot out/sample --out losses.png
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..cli import parser, run_cli
from ..evaluation import describe_losses, draw_run


def main(argv: Sequence[str] | None = None) -> int:
    p = parser("plot", __doc__)
    p.add_argument("run_dir", help="the out_dir of a scripts/train_gpt.py run (losses-rank*.jsonl and ckpt.pt)")
    p.add_argument("--out", help="the PNG to write (default: RUN_DIR/losses.png)")
    p.add_argument("--device", default="cpu", help="device for the checkpoint (default: cpu)")
    args = p.parse_args(argv)

    def body() -> None:
        out = Path(args.out) if args.out else Path(args.run_dir) / "losses.png"
        print(f"tokpack.plot: {out} ({describe_losses(draw_run(args.run_dir, out, args.device))})")

    return run_cli(body)


if __name__ == "__main__":
    raise SystemExit(main())
