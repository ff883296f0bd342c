"""``MapDataset.shuffle(permutation="grain")``: Grain's order, element for element.

The golden lists were produced by grain 0.2.18 (/work/ext/grainvenv) with the very chains
of :func:`chains` written against ``grain.MapDataset`` (the script:
``[None if ds[i] is None else int(ds[i]) for i in range(min(len(ds), 200))]`` per chain).
"""

from __future__ import annotations

import os

import pytest

import dataloader as dl
from dataloader.compat import install_grain_alias, uninstall_grain_alias
from dataloader.errors import StateMismatchError
from dataloader.samplers.index_sampler import PERMUTATION_ENV

GRAIN = {
    "seed_shuffle": (
        [12, 9, 25, 15, 31, 0, 27, 21, 17, 22, 33, 30, 3, 10, 13, 23, 8, 7, 1, 16, 20, 5,
        28, 19, 32, 34, 29, 6, 35, 4, 2, 18, 14, 26, 36, 11, 24]
    ),
    "explicit": (
        [4, 0, 32, 20, 7, 30, 8, 27, 36, 35, 1, 21, 11, 3, 17, 12, 28, 23, 25, 9, 31, 26,
        22, 18, 5, 24, 2, 10, 34, 29, 19, 13, 33, 14, 6, 16, 15]
    ),
    "explicit_big": (
        [69, 82, 25, 67, 18, 3, 60, 20, 17, 51, 98, 36, 90, 34, 35, 10, 99, 0, 32, 79, 78,
        33, 30, 22, 44, 9, 64, 96, 7, 89, 92, 74, 43, 66, 1, 38, 47, 48, 5, 87, 77, 27, 24,
        73, 62, 21, 6, 76, 16, 13, 71, 65, 2, 39, 12, 45, 54, 70, 81, 26, 52, 94, 53, 84,
        58, 11, 83, 31, 68, 86, 88, 15, 29, 49, 4, 23, 93, 72, 41, 85, 46, 57, 56, 28, 55,
        97, 8, 59, 91, 40, 61, 14, 37, 80, 63, 50, 75, 19, 95, 42, 59, 71, 96, 98, 67, 89,
        22, 57, 20, 58, 32, 49, 92, 69, 7, 75, 66, 68, 12, 0, 3, 93, 26, 27, 15, 47, 87, 79,
        4, 46, 24, 48, 74, 70, 43, 54, 33, 14, 72, 29, 36, 65, 88, 94, 44, 8, 6, 11, 1, 30,
        83, 35, 17, 91, 80, 76, 90, 25, 5, 77, 2, 56, 42, 37, 28, 45, 19, 97, 10, 84, 99,
        21, 16, 73, 61, 62, 52, 53, 85, 39, 86, 60, 38, 9, 95, 41, 78, 18, 51, 13, 23, 63,
        64, 40, 50, 34, 82, 55, 31, 81]
    ),
    "map_between": (
        [4200, 2300, 1600, 3500, 2900, 2800, 4800, 700, 3200, 2200, 400, 100, 1800, 4100,
        1200, 1000, 2100, 2700, 3900, 1500, 2600, 1900, 4000, 1400, 200, 900, 600, 3600,
        4700, 4400, 300, 1300, 2000, 3000, 3400, 0, 1700, 3300, 1100, 800, 500, 3100, 4300,
        4500, 2400, 4600, 2500, 3800, 3700, 4900]
    ),
    "slice_between": (
        [22, 41, 39, 19, 42, 37, 4, 38, 12, 24, 27, 43, 9, 6, 17, 20, 11, 31, 32, 28, 36,
        34, 25, 14, 3, 18, 33, 21, 35, 10, 13, 26, 44, 23, 8, 40, 30, 29, 16, 5, 7, 15]
    ),
    "repeat_epochs": (
        [4, 17, 16, 7, 5, 3, 18, 19, 15, 0, 2, 13, 14, 8, 11, 10, 9, 6, 1, 12, 14, 1, 15, 7,
        13, 10, 16, 4, 2, 12, 11, 0, 6, 17, 8, 3, 18, 9, 19, 5, 13, 16, 17, 14, 10, 1, 6, 5,
        11, 2, 15, 3, 19, 12, 9, 8, 0, 7, 4, 18, 17, 0, 10, 5, 7, 13, 6, 16, 11, 9, 15, 3,
        1, 12, 4, 8, 18, 2, 14, 19]
    ),
    "two_shuffles": (
        [230, 190, 150, 40, 270, 130, 180, 280, 210, 110, 220, 10, 250, 100, 60, 70, 90,
        260, 50, 290, 80, 200, 240, 120, 170, 30, 0, 160, 20, 140]
    ),
    "maxtext": (
        [21, 11, 22, 49, 46, 51, 4, 62, 27, 28, 0, 45, 56, 48, 10, 47, 7, 41, 37, 29, 12, 5,
        19, 32, 9, 52, 24, 53, 23, 8, 57, 35, 61, 6, 55, 60, 40, 44, 2, 31, 59, 13, 25, 16,
        38, 36, 33, 18, 34, 3, 43, 15, 20, 50, 58, 42, 30, 63, 54, 14, 26, 17, 1, 39, 35,
        48, 47, 39, 13, 61, 41, 50, 8, 32, 22, 55, 3, 59, 34, 24, 54, 36, 60, 38, 4, 43, 19,
        1, 0, 40, 57, 45, 53, 9, 21, 11, 7, 16, 2, 14, 25, 26, 10, 56, 52, 37, 18, 29, 28,
        46, 42, 12, 49, 63, 6, 44, 33, 20, 23, 15, 27, 62, 17, 58, 31, 51, 30, 5]
    ),
    "filter_between": (
        [7, 2, 32, None, 29, 16, 17, None, 35, None, None, None, 34, 22, 4, None, 19, 25,
        28, None, None, 26, None, 23, 1, None, 14, 38, 37, 5, 10, 8, 20, None, None, 13,
        None, 11, None, 31]
    ),
}


def chains(md, order):
    """The chains of the golden lists, each shuffle in ``order``."""
    def f(x):
        return x * 10

    return {
        "seed_shuffle": md.range(37).seed(5).shuffle(permutation=order),
        "explicit": md.range(37).shuffle(seed=5, permutation=order),
        "explicit_big": md.range(100).shuffle(seed=2**32 - 3, permutation=order).repeat(3),
        "map_between": md.range(50).seed(7).map(f).map(f).shuffle(permutation=order),
        "slice_between": md.range(50).seed(7)[3:45].shuffle(permutation=order),
        "repeat_epochs": md.range(20).seed(3).shuffle(permutation=order).repeat(4),
        "two_shuffles": md.range(30).seed(9).shuffle(permutation=order).map(f).shuffle(permutation=order),
        "maxtext": md.range(64).shuffle(seed=11, permutation=order).repeat(2)[0::1],
        "filter_between": md.range(40).seed(1).filter(lambda x: x % 3 != 0).shuffle(permutation=order),
    }


def read(ds):
    return [None if ds[i] is None else int(ds[i]) for i in range(min(len(ds), 200))]


@pytest.mark.parametrize("name", sorted(GRAIN))
def test_grain_order_reads_grains_elements(name):
    """Seeds from .seed(s) derived at Grain's depth (maps, slices, filters between), explicit
    seeds, a second shuffle, and epochs of repeat() each under (seed + epoch) mod 2**32."""
    assert read(chains(dl.MapDataset, "grain")[name]) == GRAIN[name]


def test_iterating_gives_the_same_elements_as_indexing():
    ds = chains(dl.MapDataset, "grain")["maxtext"]
    assert [int(x) for x in ds.to_iter_dataset()] == GRAIN["maxtext"]


def test_the_default_order_is_still_granarys(monkeypatch):
    monkeypatch.delenv(PERMUTATION_ENV, raising=False)
    default = dl.MapDataset.range(37).seed(5).shuffle()
    assert read(default) == read(chains(dl.MapDataset, "granary")["seed_shuffle"])
    assert read(default) != GRAIN["seed_shuffle"]


def test_the_environment_variable_picks_grains_order_for_unchanged_code(monkeypatch):
    monkeypatch.setenv(PERMUTATION_ENV, "grain")
    assert read(dl.MapDataset.range(37).seed(5).shuffle()) == GRAIN["seed_shuffle"]
    monkeypatch.setenv(PERMUTATION_ENV, "feistel")
    with pytest.raises(ValueError, match=r"GRANARY_PERMUTATION='feistel' names no shuffle order"):
        dl.MapDataset.range(37).seed(5).shuffle()


def test_install_grain_alias_can_set_grains_order(monkeypatch):
    monkeypatch.delenv(PERMUTATION_ENV, raising=False)
    monkeypatch.delenv("GRANARY_GRAIN_ALIAS", raising=False)
    install_grain_alias(force=True, permutation="grain")
    try:
        import grain

        assert read(grain.MapDataset.range(37).shuffle(seed=5)) == GRAIN["explicit"]
    finally:
        uninstall_grain_alias()
    assert PERMUTATION_ENV not in os.environ


def test_bad_orders_and_seeds_are_refused():
    with pytest.raises(ValueError, match=r"permutation='simon' names no shuffle order"):
        dl.MapDataset.range(5).shuffle(seed=1, permutation="simon")
    with pytest.raises(ValueError, match=r"takes seeds in \[0, 2\*\*32\), as Grain's shuffle does, got 4294967296"):
        dl.MapDataset.range(5).shuffle(seed=2**32, permutation="grain")
    mixed = dl.MapDataset.mix([dl.MapDataset.range(3).seed(1), dl.MapDataset.range(3).seed(1)])
    with pytest.raises(ValueError, match=r"came through a mix, concatenate or a dataset of your own"):
        mixed.shuffle(permutation="grain")
    with pytest.raises(ValueError, match=r"permutation='simon' names no shuffle order"):
        install_grain_alias(permutation="simon")


@pytest.mark.parametrize("mixed", [False, True])
def test_a_state_of_one_order_is_refused_by_the_other(mixed):
    def stream(order):
        ds = dl.MapDataset.range(20).shuffle(seed=3, permutation=order)
        if mixed:  # an index map rather than a plain IndexSampler
            ds = dl.MapDataset.mix([ds, dl.MapDataset.range(100, 120)])
        return ds.to_iter_dataset()

    it = iter(stream("grain"))
    head = [next(it) for _ in range(5)]
    state = it.get_state()
    rest = list(it)
    again = iter(stream("grain"))
    again.set_state(state)
    assert list(again) == rest and head
    other = iter(stream("granary"))
    with pytest.raises(StateMismatchError, match="grain"):
        other.set_state(state)
