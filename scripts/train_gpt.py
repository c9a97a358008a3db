"""Train a small GPT on a prepared folder, nanoGPT style, with tokpack's loader and evaluation.

    python -m tokpack.prepare                                              # data/sample
    python scripts/train_gpt.py --config configs/train_sample.toml         # CPU by default, CUDA if present
    python scripts/train_gpt.py --config configs/train_sample.toml --resume
    torchrun --standalone --nproc_per_node=2 scripts/train_gpt.py --config configs/train_sample.toml

Every ``eval_interval`` steps (and at the end) the val split is scored with ``tokpack.evaluate``
and a checkpoint is written with the model, the optimizer, the step and the loader's state, so
``--resume`` continues with exactly the batches the uninterrupted run would have seen. Under
torchrun each rank draws its own reproducible stream and DDP averages the gradients.

``[data] packing`` chooses the rows: ``"none"`` (nanoGPT's windows at random starts, across
document boundaries), or ``"aligned"`` / ``"bestfit"`` / ``"bestfit-pad"`` (``PackedDocuments``:
every row starts at a document, and with ``document_mask`` attention and positions stay inside
each document; the val split is then also scored document by document). A folder of
conversations (``--chat``) is trained and scored on its masked targets alone; ``--init-from
out/base/ckpt.pt`` starts from a pretrained model's weights (SFT).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch.nn import functional as F

from tokpack import EvalRows, PackedDocuments, Split, TokenWindows, TrainRows, build_loader, evaluate, to_device
from tokpack.cli import parser, run_cli
from tokpack.options import add_options, build_config
from tokpack.distributed import process_group
from tokpack.plot import pyplot
from tokpack.evaluation import describe_losses, draw_run
from tokpack.split import open_splits
from tokpack.models import GPT, GPTConfig, gpt_checkpoint, load_gpt


@dataclass(frozen=True)
class DataConfig:
    """``[data]`` in TOML: how training rows are cut from the documents."""

    packing: str = "none"  # none: windows at random starts (nanoGPT); aligned, bestfit or bestfit-pad: PackedDocuments
    document_mask: bool = True  # with packing: attention and positions within each document only
    buffer_size: int = 1000  # documents best fit chooses from
    split_long: bool = False  # with packing: documents longer than a row are served as pieces, not cut

    def __post_init__(self) -> None:
        if self.packing not in ("none", "aligned", "bestfit", "bestfit-pad"):
            raise ValueError(f"[data] packing {self.packing!r} is not one of none, aligned, bestfit, bestfit-pad")


@dataclass(frozen=True)
class TrainConfig:
    data_dir: str = "data/sample"
    out_dir: str = "out/sample"
    batch_size: int = 8
    max_iters: int = 600
    learning_rate: float = 3e-3
    min_lr: float = 3e-4
    warmup_iters: int = 40
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_interval: int = 100
    eval_stride: int = 0  # 0: block_size (no overlap)
    eval_batch_size: int = 8
    seed: int = 1337
    num_workers: int = 0
    device: str = "auto"
    stop_at: int = 0  # stop after this step as if interrupted, writing a checkpoint (0: never)
    init_from: str = ""  # a ckpt.pt whose weights start the run (fine-tuning a pretrained model: SFT)
    log_interval: int = 10
    model: GPTConfig = field(default_factory=GPTConfig)  # [model] in TOML; vocab_size comes from the data
    data: DataConfig = field(default_factory=DataConfig)


def lr_at(step: int, c: TrainConfig) -> float:
    """Linear warmup, then cosine decay to min_lr at max_iters (nanoGPT's schedule)."""
    if step < c.warmup_iters:
        return c.learning_rate * (step + 1) / c.warmup_iters
    progress = min(1.0, (step - c.warmup_iters) / max(1, c.max_iters - c.warmup_iters))
    return c.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (c.learning_rate - c.min_lr)


def save(path: Path, payload: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)  # a crash mid-write never leaves a half checkpoint under the real name


def main(argv: list[str] | None = None) -> int:
    p = parser("python scripts/train_gpt.py", __doc__)
    p.add_argument("--config", help="a configs/*.toml with TrainConfig keys and a [model] table; flags override it")
    add_options(p, TrainConfig, skip=("model", "data"))
    add_options(p, GPTConfig, skip=("vocab_size",))
    add_options(p, DataConfig)
    p.add_argument("--resume", action="store_true", help="continue from out_dir/ckpt.pt (default: off)")
    p.add_argument("--plot", action="store_true",
                   help="at the end, draw the loss curves into out_dir/losses.png (needs tokpack[plot]; default: off)")
    args = vars(p.parse_args(argv))
    resume, plot = args.pop("resume"), args.pop("plot")
    return run_cli(lambda: train(build_config(TrainConfig, args.pop("config"), args), resume, plot))


def train(c: TrainConfig, resume: bool, plot: bool = False) -> int:
    """Check the inputs, join torchrun's group if launched by it, and train; returns the exit code."""
    out = Path(c.out_dir)
    if resume and not (out / "ckpt.pt").is_file():
        raise FileNotFoundError(f"--resume needs {out / 'ckpt.pt'}, which does not exist; train without --resume first")
    if plot:
        pyplot()  # a missing extra is one line now, not after the training
    splits = open_splits(c.data_dir)  # meta.json read once, the splits handed to the loop
    train_split, val_split = splits["train"], splits["val"]
    with process_group(c.device) as place:
        code = _train(c, resume, train_split, val_split, place.rank, place.world_size > 1, place.device)
    if plot and place.leader:
        print(f"train_gpt: {out / 'losses.png'} ({describe_losses(draw_run(out, out / 'losses.png'))})")
    return code


def _train(c: TrainConfig, resume: bool, train_split: Split, val_split: Split, rank: int, ddp: bool,
           device: str) -> int:
    """The training loop."""
    out = Path(c.out_dir)
    master = rank == 0
    torch.manual_seed(c.seed + rank)  # dropout draws from the global RNG: seed it explicitly
    out.mkdir(parents=True, exist_ok=True)

    model_args = replace(c.model, vocab_size=train_split.meta["encoding"]["n_vocab"])
    T = model_args.block_size
    packed = c.data.packing != "none"
    masked = packed and c.data.document_mask
    # Endless either way (random starts, or packed rows): the run's length is max_iters, so
    # --resume --max-iters N can extend it.
    rows = TrainRows(c.data.packing, buffer_size=c.data.buffer_size, split_long=c.data.split_long) if packed else None
    train = PackedDocuments(train_split, T, rows=rows) if rows else TokenWindows(train_split, T)
    loader = build_loader(train, c.batch_size, seed=c.seed, num_workers=c.num_workers,
                          persistent_workers=c.num_workers > 0)
    val_loaders = {"val": build_loader(TokenWindows(val_split, T, stride=c.eval_stride or T), c.eval_batch_size)}
    if masked:  # a document-masked model is also scored as it was trained: each document alone
        documents = PackedDocuments(val_split, T, rows=EvalRows(c.eval_stride or T))
        val_loaders["val_documents"] = build_loader(documents, c.eval_batch_size)

    step, evals = 0, []
    if resume:
        model, ckpt = load_gpt(out / "ckpt.pt", device)
        if model.config != model_args:
            raise ValueError(f"checkpoint {out / 'ckpt.pt'} holds {model.config}, the config asks for {model_args}; "
                             "resume with the config it was trained with")
        loader.load_state_dict(ckpt["loader"])
        step, evals = ckpt["step"], ckpt["evals"]
    elif c.init_from:
        model, _ = load_gpt(Path(c.init_from), device)
        if model.config != model_args:
            raise ValueError(f"--init-from {c.init_from} holds {model.config}, the config asks for {model_args}; "
                             "fine-tune with the pretrained model's shape")
    else:
        model = GPT(model_args, seed=c.seed).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": c.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=c.learning_rate, betas=(0.9, 0.95))
    if resume:
        opt.load_state_dict(ckpt["optimizer"])
    net = torch.nn.parallel.DistributedDataParallel(model) if ddp else model
    if master:
        print(f"train_gpt: {model.num_params():,} parameters on {device}, {train}, step {step}/{c.max_iters}")

    def checkpoint() -> None:
        if master:
            save(out / "ckpt.pt", gpt_checkpoint(model, optimizer=opt.state_dict(), step=step,
                                                 loader=loader.state_dict(), evals=evals,
                                                 config=asdict(c)))

    def run_eval() -> None:
        for name, val_loader in val_loaders.items():
            result = evaluate(model, val_loader, device)
            evals.append({"step": step, **result} if name == "val" else {"step": step, "scope": "documents", **result})
            if master:
                print(f"step {step}: {name} loss {result['loss']:.4f}, ppl {result['ppl']:.1f}, "
                      f"{result['bits_per_byte']:.3f} bits/byte")

    started = time.perf_counter()
    with open(out / f"losses-rank{rank}.jsonl", "a" if resume else "w") as log:
        batches = iter(loader)
        while step < c.max_iters and not (c.stop_at and step >= c.stop_at):
            batch = to_device(next(batches), device)
            x, y = batch[0], batch[1]
            documents = {"position_ids": batch.position_ids, "cu_seqlens": batch.cu_seqlens} if masked else {}
            for group in opt.param_groups:
                group["lr"] = lr_at(step, c)
            loss = F.cross_entropy(net(x, **documents).flatten(0, 1), y.flatten(), ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), c.grad_clip)
            opt.step()
            step += 1
            log.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
            log.flush()  # a kill loses no logged step
            if master and step % c.log_interval == 0:
                rate = step / (time.perf_counter() - started)
                print(f"step {step}: train loss {loss.item():.4f}, lr {lr_at(step - 1, c):.2e}, {rate:.2f} steps/s")
            if step % c.eval_interval == 0 or step == c.max_iters:
                run_eval()
                checkpoint()
    if c.stop_at and step == c.stop_at:
        checkpoint()
        if master:
            print(f"train_gpt: stopped at step {step} as asked; continue with --resume")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
