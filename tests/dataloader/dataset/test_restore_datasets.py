"""Every transformation of the dataset API restores at every step to the same stream."""

from __future__ import annotations

import pytest

from tests.dataloader.dataset.pipelines import DATASETS
from tests.helpers import assert_restores_everywhere


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_restore_at_every_step_equals_uninterrupted_stream(name):
    ds = DATASETS[name]()
    outputs = assert_restores_everywhere(lambda: iter(ds), limit=45, fresh_iterator_every=3)
    assert len(outputs) >= 5, f"{name} produced only {len(outputs)} outputs"
