"""Training PaDoc models: packed ``[M | Y_1 .. Y_N]`` samples with ancestor attention.

``tree`` (pure, no torch) defines a packed sample's layout and the one visibility rule;
``attention`` (torch) implements it with three interchangeable backends (dense reference, flex,
tree-varlen) and hooks it into transformers' Qwen3-VL. ``packing`` turns annotated pages into
packed samples, ``loop`` is the training step, ``ray_train`` runs it on Ray Train with FSDP2 and
``export`` writes the Hugging Face checkpoint. Importing this package imports no torch:
torch-backed names below load on first use.
"""

from .tree import TreeLayout

_LAZY = {
    "BACKENDS": "attention",
    "tree_attention": "attention",
    "dense_mask": "attention",
    "register_tree_attention": "attention",
    "tree_varlen_kernel": "attention",
    "Packer": "packing",
    "PackingConfig": "packing",
    "PackedSample": "packing",
    "PackingError": "packing",
    "pages_from_omnidocbench": "packing",
    "pages_from_batch_output": "packing",
    "Trainer": "loop",
    "OptimConfig": "loop",
    "load_model": "loop",
    "train": "loop",
    "TrainJobConfig": "ray_train",
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
