"""PaDoc checkpoints: what makes a Qwen3-VL directory a PaDoc model, and how the code reads one.

``tokenizer``: :class:`~padoc_ray.checkpoint.tokenizer.ModelProtocol` (a checkpoint's protocol spec
bound to its Hugging Face tokenizer: what the codec, the scheduler and the trainer use);
``protocol_files``: the protocol tokens, chat template and ``padoc_protocol.json`` a checkpoint
carries; ``init``: a base Qwen3-VL -> a PaDoc checkpoint (``padoc-ray init-model``); ``tiny``: the
random-weight tiny Qwen3-VL built offline for tests and CPU benchmarks (``padoc-ray build-tiny-model``).
"""
