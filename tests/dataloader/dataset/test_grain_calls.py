"""Grain's public calls that granary took differently: a chained dataset's ``parents``,
``repeat(reseed_each_epoch=False)``, and the seed a mixture passes on when only some of
its components are seeded."""

from __future__ import annotations

import pytest

import dataloader as dl


def add_noise(x, rng):
    return x * 100 + int(rng.integers(0, 100))


def test_a_chained_dataset_names_the_dataset_it_was_called_on():
    source = dl.MapDataset.range(15)
    assert source.parents == ()
    for chained in (source.filter(bool), source.map(abs), source.map_with_index(lambda i, x: x),
                    source.random_map(add_noise, seed=1), source.shuffle(seed=1), source[2:]):
        assert len(chained.parents) == 1 and chained.parents[0] is source
    assert source.seed(3).parents == ()  # the same dataset, seeded
    mixed = dl.MapDataset.mix([source, source.map(abs)])
    assert len(mixed.parents) == 2 and mixed.parents[0] is source


def test_repeat_without_reseeding_repeats_the_first_epoch_exactly():
    once = dl.MapDataset.range(6).seed(3).shuffle().random_map(add_noise)
    first = list(once)
    again = once.repeat(3, reseed_each_epoch=False)
    assert list(again) == first * 3
    assert [again[i] for i in range(20)] == (first * 4)[:20]
    assert list(once.repeat(3))[6:12] != first  # by default each pass is new
    endless = once.repeat(reseed_each_epoch=False)
    assert [endless[i] for i in range(13)] == (first * 3)[:13]
    with pytest.raises(TypeError, match=r"repeat\(reseed_each_epoch\) must be True or False, got 'no'"):
        once.repeat(2, reseed_each_epoch="no")


def test_a_pass_that_repeats_restores_at_every_step():
    from tests.helpers import assert_restores_everywhere

    ds = dl.MapDataset.range(5).seed(1).shuffle().random_map(add_noise).repeat(3, reseed_each_epoch=False)
    out = assert_restores_everywhere(lambda: iter(ds.to_iter_dataset()), limit=15)
    assert out[:5] == out[5:10] == out[10:]


def test_a_mixture_with_one_seeded_component_seeds_the_random_maps_after_it():
    def mixture(seeded):
        return dl.MapDataset.mix([dl.MapDataset.range(15).seed(128) if i in seeded else dl.MapDataset.range(15)
                                  for i in range(7)])

    one = list(mixture({0}).random_map(add_noise))
    assert one == list(mixture({0}).random_map(add_noise))  # reproducible
    assert one != list(mixture(set(range(7))).random_map(add_noise))  # every seed counts
    assert one != list(mixture({1}).random_map(add_noise))  # and where it is
    with pytest.raises(ValueError, match=r"random_map\(.*\) needs a seed"):
        mixture(set()).random_map(add_noise)


def test_options_apply_to_the_calls_chained_after_them_too():
    """Grain: a WithOptionsIterDataset's options apply to the whole pipeline, the
    transformations before it and after it (here a filter after a thread prefetch)."""
    ds = dl.MapDataset.source([1, 2, 3]).repeat(1000).to_iter_dataset()
    strict = dl.experimental.DatasetOptions(filter_raise_threshold_ratio=0.1)
    ds = dl.experimental.WithOptionsIterDataset(ds, strict)
    ds = dl.experimental.multithread_prefetch(ds, num_threads=1, buffer_size=1).filter(lambda x: x > 2)
    with pytest.raises(ValueError, match=r"skipped 66\.70 % of the last seen 1000 elements, at or above "
                                         r"filter_raise_threshold_ratio=0\.1"):
        list(ds)
    loose = dl.experimental.WithOptionsIterDataset(ds, dl.experimental.DatasetOptions(filter_raise_threshold_ratio=0.9))
    assert len(list(loose)) == 1000  # an option set closer to the output wins
