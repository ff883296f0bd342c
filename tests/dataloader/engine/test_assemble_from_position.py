"""``from_position``: the rest of a unit result equals the result of the unit computed from there."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dataloader.engine.assemble import from_position
from dataloader.engine.compute import compute_unit
from tests.dataloader.pipelines import make_loader
from tests.helpers import assert_streams_equal


@pytest.mark.parametrize("name", ["filter", "flat_map", "filter_batch", "everything"])
def test_the_rest_of_a_unit_equals_the_unit_computed_from_there(name):
    plan = dataclasses.replace(make_loader(name).plan, fingerprint=True)
    whole = compute_unit(plan, 3, 16)
    for position in (4, 9, 15):
        rest, direct = from_position(whole, position), compute_unit(plan, position, 16)
        assert (rest.start, rest.stop) == (direct.start, direct.stop) == (position, 16)
        assert_streams_equal(rest.outputs, direct.outputs)
        for a, b in zip(rest.tags(), direct.tags()):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(rest.sources, direct.sources)
        np.testing.assert_array_equal(rest.digests, direct.digests)
