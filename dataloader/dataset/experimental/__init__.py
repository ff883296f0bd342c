"""Grain's experimental datasets that combine or reshape streams (``dl.experimental``).

One module per concept, each holding the dataset (the recipe) and its iterator (the
stage that runs in the consumer's process, on the ordered stream of its parents):
``limit``, ``repeat``, ``zip``, ``rebatch``, ``cache``, ``mix`` (the iterator-level
mixture of ``IterDataset.mix``), ``select`` (``MapDataset.select_from_datasets``) and
``elastic`` (``ElasticIterator``; ``dataloader.dataset.elastic_path`` chooses its path). Their states
nest their parents' states, hold positions and never data, and resume without
replaying the stream. ``performance``
(``pick_performance_config``) is no dataset: it sizes workers and buffers for one.
"""
