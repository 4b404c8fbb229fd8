"""Serving benchmarks: the paper's serving benchmark (``bench serve`` / ``bench replay``, :mod:`.run`), HTTP
against the engine host directly (``bench http``, :mod:`.http`) and tenant fairness under ``serve
--tenant-header`` (``bench fairness``, :mod:`.fairness`). Their reports are written by
:mod:`padoc_ray.perfmodel.table3`."""
