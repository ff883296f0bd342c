"""Operations work by subclassing and by wrapping a function, and refuse bad input."""

from __future__ import annotations

import cloudpickle
import numpy as np
import pytest

from dataloader.operations import (
    FilterTransform,
    FlatMapTransform,
    MapTransform,
    RandomMapTransform,
)


def test_map_wraps_a_function():
    assert MapTransform(lambda x: x + 1).map(1) == 2


def test_map_by_subclassing():
    class Double(MapTransform):
        def map(self, element):
            return 2 * element

    assert Double().map(4) == 8
    assert Double().name == "test_map_by_subclassing.<locals>.Double"


def test_random_map_passes_the_generator():
    rng = np.random.default_rng(0)
    expected = np.random.default_rng(0).random()
    assert RandomMapTransform(lambda x, r: x + r.random()).random_map(1.0, rng) == 1.0 + expected


def test_filter_returns_a_bool():
    f = FilterTransform(lambda x: x)
    assert f.filter(3) is True and f.filter(0) is False


def test_flat_map_by_subclassing_with_class_max_fan_out():
    class Pairs(FlatMapTransform):
        max_fan_out = 2

        def flat_map(self, element):
            return [element, element]

    assert Pairs().checked_flat_map(1) == [1, 1]


def test_flat_map_fan_out_over_the_limit_names_the_counts():
    op = FlatMapTransform(lambda x: range(x), max_fan_out=3)
    assert op.checked_flat_map(3) == [0, 1, 2]
    with pytest.raises(ValueError, match=r"produced 4 elements from one input, more than max_fan_out=3"):
        op.checked_flat_map(4)


@pytest.mark.parametrize("cls", [MapTransform, RandomMapTransform, FilterTransform, FlatMapTransform])
def test_non_callable_is_refused(cls):
    with pytest.raises(TypeError, match=rf"{cls.__name__} needs a callable, got 'decode' \(str\)"):
        cls("decode")


@pytest.mark.parametrize("cls", [MapTransform, FilterTransform])
def test_no_function_and_no_override_is_refused(cls):
    with pytest.raises(TypeError, match=rf"{cls.__name__} was given no function and does not override"):
        cls()


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_max_fan_out_is_refused(bad):
    with pytest.raises(ValueError, match=r"max_fan_out must be a positive integer or None"):
        FlatMapTransform(lambda x: [x], max_fan_out=bad)


def test_names_are_stable_and_readable():
    def decode(x):
        return x

    assert MapTransform(decode).name == "MapTransform(test_names_are_stable_and_readable.<locals>.decode)"
    assert MapTransform(len).name == "MapTransform(len)"


def test_element_fn_skips_the_wrapper_for_plain_functions():
    def f(x):
        return x

    assert MapTransform(f).element_fn() is f

    class Sub(MapTransform):
        def map(self, element):
            return element

    op = Sub()
    assert op.element_fn() == op.map


def test_lambda_operations_survive_cloudpickle():
    op = cloudpickle.loads(cloudpickle.dumps(MapTransform(lambda x: x * 3)))
    assert op.map(2) == 6


def test_each_operation_declares_how_it_runs():
    """The engine, the config and the dataset API read these instead of classes."""
    from dataloader.operations import MapWithIndexTransform
    from dataloader.operations.transforms import ELEMENT, KEEP, MANY, ONE

    declared = {
        cls.__name__: (cls.runs, cls.returns, cls.needs_seed, cls.needs_index)
        for cls in (MapTransform, RandomMapTransform, FilterTransform, FlatMapTransform, MapWithIndexTransform)
    }
    assert declared == {
        "MapTransform": (ELEMENT, ONE, False, False),
        "RandomMapTransform": (ELEMENT, ONE, True, False),
        "FilterTransform": (ELEMENT, KEEP, False, False),
        "FlatMapTransform": (ELEMENT, MANY, False, False),
        "MapWithIndexTransform": (ELEMENT, ONE, False, True),
    }
    assert FilterTransform(bool).reshapes and FlatMapTransform(list).reshapes
    assert not MapTransform(str).reshapes


def test_batches_and_packers_declare_where_they_run():
    from dataloader.operations import Batch, BatchAndPad, ConcatThenSplit, FirstFitPack
    from dataloader.operations.transforms import GROUP, STREAM

    assert Batch(2).runs == BatchAndPad(2).runs == GROUP
    assert FirstFitPack.runs == ConcatThenSplit.runs == STREAM


def test_seed_rule_prefers_the_operations_own_seed():
    from dataloader.operations.transforms import resolve_seed

    op = RandomMapTransform(lambda x, rng: x)
    assert resolve_seed(op, 7) == 7
    op.rng_seed = 3
    assert resolve_seed(op, 7) == 3
    assert resolve_seed(MapTransform(str), None) is None


def test_seed_rule_refuses_a_random_map_without_any_seed():
    from dataloader.operations.transforms import resolve_seed

    with pytest.raises(ValueError, match=r"operations\[2\] RandomMapTransform\(.*\) is a random map but the sampler has no seed; pass seed="):
        resolve_seed(RandomMapTransform(lambda x, rng: x), None, "operations[2] ")


@pytest.mark.parametrize("seed", [-1, 2**64, 1.5, True])
def test_seed_rule_refuses_a_seed_a_generator_cannot_take(seed):
    from dataloader.operations.transforms import resolve_seed

    op = RandomMapTransform(lambda x, rng: x)
    op.rng_seed = seed
    with pytest.raises(ValueError, match=rf"has the seed {seed!r}; .* must be an integer in \[0, 2\*\*64\)"):
        resolve_seed(op, 1)
