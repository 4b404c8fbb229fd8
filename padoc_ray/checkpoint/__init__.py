"""PaDoc checkpoints: what makes a Qwen3-VL directory a PaDoc model, and how the code reads one.

A checkpoint's protocol spec bound to its Hugging Face tokenizer (what the codec, the scheduler,
the engine's logits processors and the trainer use) is :class:`padoc_ray.tokenizer.ModelProtocol`,
one layer below this package. ``protocol_files``: the protocol tokens, chat template and ``padoc_protocol.json`` a checkpoint
carries; ``init``: a base Qwen3-VL -> a PaDoc checkpoint (``padoc-ray init-model``); ``tiny``: the
random-weight tiny Qwen3-VL built offline for tests and CPU benchmarks (``padoc-ray build-tiny-model``).
"""
