"""Online parsing on Ray Serve: ``padoc-ray serve`` (:mod:`.cli`), the application (:mod:`.app`),
its configuration (:mod:`.config`), document handling (:mod:`.documents`) and async jobs (:mod:`.jobs`)."""
