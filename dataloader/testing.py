"""``assert_equal_output_after_checkpoint``: Grain's checkpoint test helper, as library code.

Give it a (small, finite) dataset; it iterates the dataset to the end, recording the
state before every element, then for every step restores a new iterator from that
state and checks that the rest of the stream is the same. Use it in your own tests of a
custom ``IterDataset`` / ``DatasetIterator``:

    >>> import dataloader as dl
    >>> ds = dl.MapDataset.range(6).seed(1).shuffle().to_iter_dataset().batch(2)
    >>> dl.experimental.assert_equal_output_after_checkpoint(ds)

What it checks, beyond Grain's version: every state goes through JSON (as it does into
a checkpoint) before it is restored, and the state an iterator reports right after
``set_state`` is the one it was given (after the same JSON round trip). Grain also
requires every state to keep one structure (it stores states as fixed-shape trees);
granary's states are JSON, whose shape may change along the stream (a packer's
offsets, say), so that is not required.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np


def _json(state: Any, step: int) -> Any:
    try:
        return json.loads(json.dumps(state))
    except (TypeError, ValueError) as exc:
        raise AssertionError(
            f"the state before step {step} is not JSON-serialisable ({exc}): {str(state)[:300]}"
        ) from exc


def assert_equal_output_after_checkpoint(ds: Any) -> None:
    """Restores ``ds``'s iterator at every step and checks the rest of the stream.

    Args:
        ds: a finite ``IterDataset`` (or anything whose ``iter()`` has ``get_state``
            and ``set_state``); ``LimitIterDataset`` makes a long one short.

    Raises:
        AssertionError: the dataset yields nothing, a state is not JSON, a restored
            iterator reports another state, or its output differs (naming the step).
    """
    iterator = iter(ds)
    states: list[Any] = []
    expected: list[Any] = []
    try:
        while True:
            state = _json(iterator.get_state(), len(expected))
            try:
                value = next(iterator)
            except StopIteration:
                break
            states.append(state)
            expected.append(value)
    finally:
        _close(iterator)
    assert expected, f"the dataset produced no elements: {ds!r}"
    for step, state in enumerate(states):
        restored = iter(ds)
        try:
            restored.set_state(state)
            now = _json(restored.get_state(), step)
            np.testing.assert_equal(
                now, state, f"the state after set_state differs from the one restored at step {step}"
            )
            values = list(restored)
        finally:
            _close(restored)
        np.testing.assert_equal(
            values, expected[step:], f"the output restored at step {step} differs from the original"
        )


def _close(iterator: Any) -> None:
    if hasattr(iterator, "close"):
        iterator.close()
