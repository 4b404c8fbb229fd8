"""The batch job: Ray Data stages (:mod:`.stages`), the driver (:mod:`.job`: listing, resume, the
documents table; the only code that removes leftovers under ``pages/``), its bookkeeping at scale
(:mod:`.ledger`, :mod:`.columns`, :mod:`.docids`; the commit records it writes are
:mod:`padoc_ray.output.commits`), input caps (:mod:`.limits`), one
run per output (:mod:`.lock`) and its config (:mod:`.config`). The row format it writes is
:mod:`padoc_ray.output`'s; corpus re-annotation, which runs it once per prediction set, is
:mod:`padoc_ray.curation`."""
