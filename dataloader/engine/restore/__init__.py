"""The restore room: a saved state in, a pipeline going on from it out.

One home for restore (docs/elastic-restore.md, docs/elastic-protocol.md): a state (one
host's, or every old host's) is parsed once into one typed value at the door, checked
once (the fingerprint included), and each stage gets its part.

* :mod:`.saved`: the typed values (``LoaderState``, ``OldHosts``) and their parsing.
* :mod:`.protocol`: what a stage answers to take part in an elastic restore
  (``ElasticStage``, ``ElasticHead``), checked once when the restore is made.
* :mod:`.every_host`: the entry point of an elastic restore (every old host's states).
* :mod:`.resume`: the loader iterator's restore: reading (Grain's and streaming
  iterators' states too), the engine, the position, the fingerprint check.
* :mod:`.relayout`: the engine a state calls for (the loader's own, or an elastic
  layout's); :mod:`.layout` and :mod:`.samplers`: the layout arithmetic and the
  samplers that read a layout's share or one saved step.
* :mod:`.verify`: the fingerprint check, in this process or in workers.
* :mod:`.grain`: states written by Grain, read where granary continues them exactly.

Submodules are imported by name (``from dataloader.engine.restore.saved import ...``):
the state format (:mod:`dataloader.engine.state`) and this room import each other's
parts, so this package's ``__init__`` imports nothing.
"""
