"""Command-line flags of training, shared by ``padoc-ray train`` and ``jobs/train.py``.

``register(sub)`` adds ``train`` to the ``padoc-ray`` subcommands; ``add_train_args(p)`` adds
the flags to any parser; ``run_from_args(args)`` validates, runs and returns an exit code (0 done,
1 the run failed, 2 bad usage or inputs; user errors are one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from padoc_ray.cli.common import add_command, die, positive
from padoc_ray.trainer.config import BACKENDS  # pure: building the parser imports no torch

DESCRIPTION = """\
Train a PaDoc checkpoint on annotated pages with ancestor attention: each page becomes one packed
sample [prompt+image+layout | branch 1 | ... | branch N] where every branch sees the image and the
layout up to its region only. Runs Ray Train (TorchTrainer, FSDP2, gloo on CPU / nccl on GPU) with
--workers workers; writes OUT/metrics.jsonl (one line per step), distributed checkpoints under
OUT/ray_results/RUN_NAME (rerunning the same command resumes from the latest), and at the end the
Hugging Face checkpoint OUT/model that vLLM and the batch job load."""


def add_train_args(p: argparse.ArgumentParser) -> None:
    io = p.add_argument_group("inputs and outputs")
    io.add_argument("--model", required=True, help="checkpoint directory to start from (holds padoc_protocol.json)")
    io.add_argument("--gt", default=None, help="OmniDocBench-format ground-truth JSON (a list of pages)")
    io.add_argument("--images", default=None, help="folder holding each page's page_info.image_path")
    io.add_argument("--batch-output", default=None,
                    help="instead of --gt/--images: padoc-ray batch output (folder with pages/ or Parquet files); "
                         "rows with status ok are trained on, their images re-rendered from source_uri")
    io.add_argument("--sample-weights", default=None, metavar="AGREEMENT.parquet",
                    help="a re-annotation's OUTPUT/agreement/agreement.parquet: draw pages by difficulty, with "
                         "probability proportional to 0.25 + difficulty (the hardest pages 5x as often as the "
                         "easiest); pages without a consensus, or not in the table, are never drawn")
    io.add_argument("--out", required=True, help="output folder: metrics.jsonl, ray_results/, model/")
    tr = p.add_argument_group("training")
    tr.add_argument("--steps", type=positive(int), required=True, help="optimizer steps in total (a resumed run "
                                                                          "continues up to this number)")
    tr.add_argument("--backend", choices=BACKENDS, default="tree_varlen",
                    help="ancestor-attention backend: dense (materialized mask, the reference), flex (flex attention; "
                         "no backward on CPU), tree_varlen (gathered prefixes + varlen causal attention; default)")
    tr.add_argument("--workers", type=positive(int), default=1, help="Ray Train workers (default 1)")
    tr.add_argument("--lr", type=positive(float), default=5e-6,
                    help="peak learning rate, after linear warm-up, cosine decay to 0 (default 5e-6, the paper's)")
    tr.add_argument("--warmup-steps", type=int, default=None, help="warm-up steps (default min(500, 5%% of --steps))")
    tr.add_argument("--max-len", type=positive(int), default=8192,
                    help="tokens per packed page; longer pages drop whole trailing regions (default 8192)")
    tr.add_argument("--max-pixels", type=positive(int), default=None,
                    help="image pixel budget instead of the checkpoint processor's (fewer image tokens; written "
                         "into the exported preprocessor_config.json)")
    tr.add_argument("--grad-accum", type=positive(int), default=1,
                    help="packed pages per step and worker (global batch = workers x grad-accum; default 1)")
    tr.add_argument("--checkpoint-every", type=positive(int), default=50,
                    help="steps between distributed checkpoints; the last step always saves (default 50)")
    tr.add_argument("--seed", type=int, default=0, help="data-order seed (default 0)")
    tr.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="auto: GPUs when the cluster has one per worker, else CPU (default auto)")
    tr.add_argument("--resume", default=None, metavar="CHECKPOINT_DIR",
                    help="start from this checkpoint (a checkpoint_* folder) when the run has none of its own. Loading "
                         "a checkpoint unpickles its metadata (a crafted folder runs code on every worker), so it "
                         "must be under --out, or owned by you, with no symbolic links, writable by no one else")
    tr.add_argument("--run-name", default="train", help="run name under OUT/ray_results (default train)")
    p.add_argument("--address", default=None,
                   help="Ray cluster address (default: RAY_ADDRESS, else a local cluster started for this run)")


def register(sub) -> argparse.ArgumentParser:
    p = add_command(sub, "train", help="train a checkpoint with ancestor attention on Ray Train (FSDP2)",
                       description=DESCRIPTION + " Same flags as jobs/train.py.")
    add_train_args(p)
    p.set_defaults(func=run_from_args)
    return p


def config_from_args(args: argparse.Namespace):
    """The :class:`~padoc_ray.trainer.config.TrainConfig` of the flags; TrainInputError on a bad value."""
    from padoc_ray.trainer.config import (
        DataConfig,
        LoopConfig,
        OptimConfig,
        PackingConfig,
        RayConfig,
        StepConfig,
        TrainConfig,
    )

    return TrainConfig(
        model=args.model, out=args.out,
        data=DataConfig(gt=args.gt, images=args.images, batch_output=args.batch_output,
                        sample_weights=args.sample_weights,
                        packing=PackingConfig(max_len=args.max_len, max_pixels=args.max_pixels)),
        loop=LoopConfig(steps=args.steps, seed=args.seed,
                        optim=OptimConfig(lr=args.lr, warmup_steps=args.warmup_steps),
                        step=StepConfig(backend=args.backend, grad_accum=args.grad_accum)),
        ray=RayConfig(workers=args.workers, device=args.device, address=args.address or os.environ.get("RAY_ADDRESS"),
                      run_name=args.run_name, checkpoint_every=args.checkpoint_every, resume=args.resume),
    )


def run_from_args(args: argparse.Namespace) -> int:
    from padoc_ray.trainer.ray_train import TrainInputError, check_inputs, run_training

    try:
        cfg = config_from_args(args)
        check_inputs(cfg)
    except TrainInputError as e:
        return die(str(e), exit=False)
    try:
        summary = run_training(cfg, progress=lambda m: print(f"padoc-ray train: {m}", file=sys.stderr))
    except TrainInputError as e:
        return die(str(e), exit=False)
    except Exception as e:  # noqa: BLE001 - a failed Ray run: one line, details are in the worker logs above
        logging.getLogger(__name__).debug("training failed", exc_info=True)
        return die(f"training failed: {type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}",
                      1, exit=False)
    print(json.dumps(summary, indent=2))
    print(f"metrics: {os.path.join(summary['out'], 'metrics.jsonl')}; model: {summary['model']}")
    return 0
