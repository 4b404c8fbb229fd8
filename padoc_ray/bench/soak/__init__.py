"""The soak benchmark: many closed-loop HTTP clients against ``padoc-ray serve`` for minutes, its
processes' memory sampled all along (``bench soak``). :mod:`.run` runs it, :mod:`.traffic` is the clients,
:mod:`.procs` the processes it watches, :mod:`.report` the figures."""
