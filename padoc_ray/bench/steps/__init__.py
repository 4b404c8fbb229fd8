"""Engine step time against batch composition (``bench steps``, :mod:`.run`) and the series the performance
model fits from it (:mod:`.series`)."""
