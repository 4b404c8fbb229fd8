"""Corpus curation: the paper's re-annotation loop (``padoc-ray reannotate``), in one place.

:mod:`.importers` reads other parsers' outputs (MinerU, dots.ocr, OmniDocBench JSON, padoc-ray batch
outputs) as prediction sets, :mod:`.agreement` compares two annotations of a page, :mod:`.consensus`
merges several into one, and :mod:`.reannotate` drives it all over a corpus: it runs the batch job
once per prediction set padoc-ray parses itself, then writes the consensus annotations, the agreement
table and the difficulty of every page. How a difficulty becomes a training weight is the trainer's
(:func:`padoc_ray.trainer.packing.sample_weight`).

Importers, agreement and consensus are pure (no ray, vllm, torch or transformers); the driver runs
the batch job, so this package sits above :mod:`padoc_ray.pipeline` and only the command imports it.
Importing the package imports none of its modules.
"""
