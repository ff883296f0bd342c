"""mp_prefetch: the output and the states do not depend on the number of workers."""

from __future__ import annotations

import json

import pytest

from tests.dataloader.dataset.pipelines import DATASETS, endless_mix, everything_chained
from tests.helpers import assert_restores_everywhere, assert_streams_equal, take
from tests.integration.conftest import no_leaks  # noqa: F401  (autouse: no child or block left)

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]


def test_mp_prefetch_output_is_equal_for_0_1_and_2_workers():
    reference = list(everything_chained(0))
    for workers in (1, 2):
        assert_streams_equal(list(everything_chained(workers)), reference)


def test_mixture_with_component_operations_is_equal_with_workers():
    from dataloader import MultiprocessingOptions

    ds = DATASETS["mix_with_component_ops"]()
    reference = take(iter(ds), 30)
    with iter(ds.mp_prefetch(MultiprocessingOptions(num_workers=2))) as it:
        assert_streams_equal(take(it, 30), reference)


def test_mixture_streamed_by_two_workers_equals_its_elements_by_index():
    from dataloader import MultiprocessingOptions

    mixed = endless_mix()
    with iter(mixed.to_iter_dataset().mp_prefetch(MultiprocessingOptions(num_workers=2))) as it:
        streamed = take(it, 60)
    assert_streams_equal(streamed, list(mixed[:60]))


def test_restore_at_every_step_with_two_workers():
    ds = everything_chained(2)
    outputs = assert_restores_everywhere(lambda: iter(ds), limit=16, fresh_iterator_every=8)
    assert_streams_equal(outputs, list(everything_chained(0))[:16])


def test_state_saved_with_two_workers_restores_in_process():
    reference = list(everything_chained(0))
    with iter(everything_chained(2)) as it:
        take(it, 5)
        state = json.dumps(it.get_state())
    restored = iter(everything_chained(0))
    restored.set_state(json.loads(state))
    assert_streams_equal(list(restored), reference[5:])
