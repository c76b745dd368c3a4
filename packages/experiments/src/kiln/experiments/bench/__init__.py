"""``kiln-bench``: the entry point (:mod:`.cli`), one job (:mod:`.runner`), the measurement
(:mod:`.harness`, :mod:`.memory`, :mod:`.stats`) and the typed config (:mod:`.schema`)."""
