"""Online parsing on Ray Serve: the application (:mod:`.app`), its configuration (:mod:`.config`),
document handling (:mod:`.documents`) and async jobs (:mod:`.jobs`). ``padoc-ray serve`` lives in
:mod:`padoc_ray.cli.serve`."""
