"""``kiln-train``: the entry point (:mod:`.cli`), one job (:mod:`.runner`), one process
(:mod:`.worker`) and the typed config (:mod:`.schema`)."""
