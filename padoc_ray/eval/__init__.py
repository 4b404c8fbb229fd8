"""Evaluation: PageIoU layout metrics (paper App. B) and OmniDocBench v1.6 end-to-end metrics.

The metric code is pure Python/numpy (no ray, vllm or torch); its command-line glue lives in :mod:`padoc_ray.cli.evaluate`.
"""
