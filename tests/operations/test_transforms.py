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
