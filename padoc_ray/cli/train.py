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
from padoc_ray.cli.flags import add_fields, from_args

# pure: building the parser imports no torch
from padoc_ray.trainer.config import DataConfig, LoopConfig, OptimConfig, PackingConfig, RayConfig, StepConfig

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
    add_fields(io, DataConfig, ("gt", "images", "batch_output", "sample_weights"))
    io.add_argument("--out", required=True, help="output folder: metrics.jsonl, ray_results/, model/")
    tr = p.add_argument_group("training")
    tr.add_argument("--steps", type=positive(int), required=True, help="optimizer steps in total (a resumed run "
                                                                          "continues up to this number)")
    add_fields(tr, StepConfig, ("backend",))
    add_fields(tr, RayConfig, ("workers",), number=positive)
    add_fields(tr, OptimConfig, ("lr", "warmup_steps"), number=positive, numbers=("lr",))
    add_fields(tr, PackingConfig, ("max_len", "max_pixels"), number=positive)
    add_fields(tr, StepConfig, ("grad_accum",), number=positive)
    add_fields(tr, RayConfig, ("checkpoint_every",), number=positive)
    add_fields(tr, LoopConfig, ("seed",))
    add_fields(tr, RayConfig, ("device", "resume", "run_name"))
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
    from padoc_ray.trainer.config import TrainConfig

    return TrainConfig(
        model=args.model, out=args.out,
        data=from_args(DataConfig, args, packing=from_args(PackingConfig, args)),
        loop=from_args(LoopConfig, args, steps=args.steps, optim=from_args(OptimConfig, args),
                       step=from_args(StepConfig, args)),
        ray=from_args(RayConfig, args, address=args.address or os.environ.get("RAY_ADDRESS")),
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
