"""Every benchmark's measuring code; ``padoc-ray bench ...`` (:mod:`padoc_ray.cli.bench`) prints and writes
what these return. Figures go in reports and issue notes, never in tests. Library code never imports this."""
