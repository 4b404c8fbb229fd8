"""Training PaDoc models: packed ``[M | Y_1 .. Y_N]`` samples with ancestor attention.

``tree`` (pure, no torch) defines a packed sample's layout and the one visibility rule;
``config`` (pure) holds every setting of a run as one tree (:class:`TrainConfig`);
``attention`` (torch) implements the rule with three interchangeable backends (dense reference,
flex, tree-varlen) and hooks it into transformers' Qwen3-VL. ``packing`` turns annotated pages
into packed samples, ``loop`` is the training step and the one training loop, ``ray_train`` runs
that loop on Ray Train workers with FSDP2 (hooks for the all-reduce, checkpoints, metrics and the
export) and ``export`` writes the Hugging Face checkpoint. Importing this package imports no
torch: torch-backed names below load on first use.
"""

from .tree import TreeLayout

_LAZY = {
    "BACKENDS": "attention",
    "tree_attention": "attention",
    "dense_mask": "attention",
    "register_tree_attention": "attention",
    "tree_varlen_kernel": "attention",
    "Packer": "packing",
    "PackedSample": "packing",
    "PackingError": "packing",
    "pages_from_omnidocbench": "packing",
    "pages_from_batch_output": "packing",
    "Trainer": "loop",
    "LoopHooks": "loop",
    "load_model": "loop",
    "train": "loop",
    "TrainConfig": "config",
    "DataConfig": "config",
    "PackingConfig": "config",
    "LoopConfig": "config",
    "OptimConfig": "config",
    "StepConfig": "config",
    "RayConfig": "config",
    "TrainInputError": "config",
    "run_training": "ray_train",
    "export_checkpoint": "export",
}

__all__ = ["TreeLayout", *_LAZY]


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{mod}"), name)
