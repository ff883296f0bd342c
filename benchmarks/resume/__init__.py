"""The resume-correctness matrix's parts: the data and pipeline every loader runs
(:mod:`.common`), the child process that runs one phase of one cell (:mod:`.child`),
and one module per loader (its columns) that builds the pipeline the way that loader's
documentation says and checkpoints it the way it documents."""
