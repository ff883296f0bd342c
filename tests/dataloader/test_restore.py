"""Restore at every step (epoch boundaries included) equals the uninterrupted stream."""

from __future__ import annotations

import pytest

from tests.dataloader.pipelines import PIPELINES, make_loader
from tests.helpers import assert_restores_everywhere


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_restore_at_every_step_equals_uninterrupted_stream(name):
    loader = make_loader(name)
    outputs = assert_restores_everywhere(lambda: iter(loader), limit=80)
    assert outputs, "the pipeline produced nothing"


@pytest.mark.parametrize("name", ["batch", "filter_batch", "flat_map", "everything"])
def test_restore_on_a_sharded_infinite_stream(name):
    loader = make_loader(name, epochs=None, shard=(1, 3))
    assert_restores_everywhere(lambda: iter(loader), limit=40, fresh_iterator_every=3)


@pytest.mark.parametrize("name", ["batch", "everything", "flat_map"])
def test_restore_with_read_ahead_threads(name):
    import dataloader as dl

    loader = make_loader(name, read_options=dl.ReadOptions(num_threads=2, prefetch_buffer_size=3))
    plain = list(make_loader(name))
    outputs = assert_restores_everywhere(lambda: iter(loader), limit=40, fresh_iterator_every=4)
    from tests.helpers import assert_streams_equal

    assert_streams_equal(outputs, plain[:40])
