"""`padoc-ray bench model`: a discrete-event model of one engine serving pages under a closed loop.

What a run will cost before it starts: the model replays per-page request traces (image tokens,
prompt, layout stream, each region's content and fork point) through one engine's envelope
(``max_num_seqs``, ``max_num_batched_tokens`` with chunked prefill, prefix-cache reuse in full blocks)
and a step-time function (:mod:`.step`), with the real :class:`~padoc_ray.scheduler.state.PageState`
deciding every fork. It is the engine-bound limit: the engine never idles, the host costs nothing.

Pure: imports no ray, vllm or torch.
"""
