"""``EvalBatches`` is ``end="pad"`` over MaxText's eval batches (dataloader/maxtext/eval.py):
the same steps and padding as ``dl.end_together``, its mask folded into the batches' own.

Hosts are threads, agreeing through an in-memory all-gather (tests/dataloader/engine/
test_finite_end.py's ``Hosts``), as JAX's key-value store lets processes agree."""

from __future__ import annotations

import numpy as np

import dataloader as dl
from dataloader.maxtext import EvalBatches, padding_batch
from dataloader.maxtext.format import KEYS
from tests.dataloader.engine.test_finite_end import Hosts

BATCH, LENGTH = 2, 4


def eval_batches(host: int) -> list[dict[str, np.ndarray]]:
    """Host 0 has 2 batches, host 1 has 5; each host's last batch has one padded row."""
    out = []
    count = 2 if host == 0 else 5
    for b in range(count):
        batch = {k: np.full((BATCH, LENGTH), 100 * host + 10 * b + i, np.int32) for i, k in enumerate(KEYS)}
        batch["mask"] = np.asarray([True, b < count - 1])
        for k in KEYS:
            batch[k][~batch["mask"]] = 0
        out.append(batch)
    return out


def run(hosts: int, make):
    group = Hosts(hosts)
    return group.run(lambda h: list(make(h, lambda: group.exchange(h))))


def test_eval_batches_give_what_end_pad_gives_with_the_mask_folded_in():
    def eval_(h, exchange):
        return EvalBatches(iter(eval_batches(h)), batch_size=BATCH, length=LENGTH, lookahead=2, exchange=exchange)

    def pad(h, exchange):
        end = dl.PadEnd(lookahead=2, mask_key="real", example=padding_batch(BATCH, LENGTH), exchange=exchange)
        return dl.end_together(iter(eval_batches(h)), batch_size=BATCH, end=end)

    got, padded = run(2, eval_), run(2, pad)
    assert [len(g) for g in got] == [5, 5]  # every host steps until the last host's last batch
    for host_got, host_padded in zip(got, padded):
        assert len(host_got) == len(host_padded)
        for a, b in zip(host_got, host_padded):
            assert sorted(a) == sorted([*KEYS, "mask"])
            assert np.array_equal(a["mask"], b["mask"] & b["real"])
            for k in KEYS:
                assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k


def test_a_host_that_ran_out_gives_all_padding_batches_and_counts_them():
    iterators = {}

    def eval_(h, exchange):
        iterators[h] = EvalBatches(iter(eval_batches(h)), batch_size=BATCH, length=LENGTH, exchange=exchange)
        return iterators[h]

    got = run(2, eval_)
    expected_0 = [*eval_batches(0), *[padding_batch(BATCH, LENGTH)] * 3]
    for a, b in zip(got[0], expected_0, strict=True):
        assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in b)
    for a, b in zip(got[1], eval_batches(1), strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in b)
    assert [iterators[h].padding_batches for h in (0, 1)] == [3, 0]


def test_one_process_passes_the_batches_through():
    out = list(EvalBatches(iter(eval_batches(1)), batch_size=BATCH, length=LENGTH))
    assert len(out) == 5
    for a, b in zip(out, eval_batches(1)):
        assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in b)
