"""A ``DataLoader``'s element-wise operations after a packer run on its worker pool.

The packer stays in the training process; the maps, filters, flat maps and random maps
after it go to workers, with the output and the states of the element-by-element stage
(``worker_count=0``), so states restore across worker counts.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import dataloader as dl
from dataloader.engine.stages.elementwise import ElementwiseIterator
from dataloader.engine.stages.shipped import ShippedElementwiseIterator
from tests.dataloader.dataset.test_pooled import run as outputs_and_states
from tests.helpers import assert_streams_equal, take
from tests.integration.conftest import no_leaks  # noqa: F401  (autouse: no child or block left)

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]

N = 400


def tokens(i):
    return {"tokens": np.arange(1 + int(i) % 5, dtype=np.int64) + int(i)}


def add_pid(row):
    return {**row, "pid": np.asarray(os.getpid())}


def scale(row):
    return {**row, "y": row["tokens"] * 3 + row["tokens_segment_ids"]}


def keep(row):
    return int(row["tokens"].sum()) % 4 != 0


def halves(row):
    return [{**row, "half": np.asarray(0)}, {**row, "half": np.asarray(1)}]


def noise(row, rng):
    return {**row, "noise": rng.integers(0, 1000, size=2)}


def loader(workers, ops=None, kind="processes"):
    if ops is None:
        ops = [dl.MapTransform(scale), dl.FilterTransform(keep), dl.FlatMapTransform(halves, max_fan_out=2),
               dl.RandomMapTransform(noise), dl.Batch(3)]
    return dl.DataLoader(
        dl.RangeDataSource(N), dl.IndexSampler(N, shuffle=True, num_epochs=1, seed=5),
        [dl.MapTransform(tokens), dl.FirstFitPack({"tokens": 8}, num_packing_bins=2), *ops],
        worker_count=workers, worker_kind=kind,
    )


def run(workers, kind="processes"):
    """Every output, and the state (as JSON) before the first and after each."""
    return outputs_and_states(loader(workers, kind=kind))


def stages(it):
    found, stage = [], it
    while stage is not it.head:
        found.append(stage)
        stage = stage._parents[0]
    return found


def test_with_workers_the_operations_after_the_packer_are_shipped():
    for workers, kind in ((0, ElementwiseIterator), (2, ShippedElementwiseIterator)):
        it = iter(loader(workers))
        assert [type(s) for s in stages(it) if isinstance(s, (ElementwiseIterator, ShippedElementwiseIterator))] \
            == [kind]
        it.close()


def test_same_output_and_every_state_for_every_worker_count():
    out0, states0 = run(0)
    assert len(out0) > 50
    for workers in (1, 2):
        out, states = run(workers)
        assert_streams_equal(out, out0)
        assert states == states0


def test_threads_after_the_packer_give_the_same_output_and_every_state():
    """worker_kind reaches the pool of the stage after the packer: its maps run on threads
    of this process, and the batches and states are those of 0 workers and of processes."""
    out0, states0 = run(0)
    out, states = run(2, "threads")
    assert_streams_equal(out, out0)
    assert states == states0
    it = iter(loader(2, [dl.MapTransform(add_pid), dl.Batch(4)], kind="threads"))
    shipped = [s for s in stages(it) if isinstance(s, ShippedElementwiseIterator)]
    pids = {int(p) for batch in it for p in np.asarray(batch["pid"]).ravel()}
    it.close()
    assert len(shipped) == 1 and pids == {os.getpid()}  # on the pool, in this process


def test_a_state_moves_between_kinds_after_the_packer():
    out0, states0 = run(0)
    _, states = run(2, "threads")
    for k in (1, len(out0) // 2):
        it = loader(2, kind="processes").iterator(json.loads(states[k]))
        assert_streams_equal(list(it), out0[k:])
        it.close()
    it = loader(2, kind="threads").iterator(json.loads(states0[7]))
    assert_streams_equal(list(it), out0[7:])
    it.close()


def test_a_state_restores_at_several_steps_across_worker_counts():
    out0, states0 = run(0)
    steps = [0, 1, 7, len(out0) // 2, len(out0) - 1, len(out0)]
    for saved_with, restored_with in ((0, 2), (2, 0), (2, 1)):
        _, states = run(saved_with) if saved_with else (out0, states0)
        for k in steps:
            it = loader(restored_with).iterator(json.loads(states[k]))
            assert_streams_equal(list(it), out0[k:])
            it.close()


def test_a_running_iterator_restores_with_workers():
    out0, states0 = run(0)
    it = iter(loader(2))
    take(it, 20)
    for k in (5, 30, 3):
        it.set_state(json.loads(states0[k]))
        assert_streams_equal(take(it, 10), out0[k : k + 10])
    it.close()


def test_no_user_operation_runs_in_the_training_process_with_workers():
    ops = [dl.MapTransform(add_pid), dl.Batch(4)]
    it = iter(loader(2, ops))
    pids = {int(p) for batch in it for p in np.asarray(batch["pid"]).ravel()}
    it.close()
    assert pids and os.getpid() not in pids
    it = iter(loader(0, ops))
    assert {int(p) for batch in it for p in np.asarray(batch["pid"]).ravel()} == {os.getpid()}
    it.close()


def fail_on_record_300(row):
    if 300 in row["tokens"].tolist():
        raise ValueError("record 300")
    return row


def fails(row):
    return 300 in row["tokens"].tolist()  # records 298, 299 and 300 hold token 300


def fail_on_token_300(row):
    if fails(row):
        raise ValueError("token 300")
    return row


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_an_error_after_the_packer_is_named_at_its_place_and_the_stream_goes_on(workers):
    rows = list(loader(0, []))
    failing = [i for i, r in enumerate(rows) if fails(r)]
    assert len(failing) >= 2
    it = iter(loader(workers, [dl.MapTransform(fail_on_token_300)]))
    for i, row in enumerate(rows):
        if i not in failing:
            assert_streams_equal([next(it)], [row])
            continue
        with pytest.raises(dl.PipelineError, match=r"MapTransform\(fail_on_token_300\) failed.*token 300") as caught:
            next(it)
        assert caught.value.position == i  # the packed row's place in the stream
        # As element by element: the state names the row after it, where it goes on.
        assert it.get_state()["stages"]["index"] == i + 1
    with pytest.raises(StopIteration):
        next(it)
    it.close()


def test_an_operation_after_the_packer_that_cannot_reach_the_workers_is_refused_at_construction():
    import threading

    lock = threading.Lock()
    ops = [dl.MapTransform(lambda row: (lock, row)[1])]
    with pytest.raises(TypeError, match=r"in MapTransform\(.*<lambda>\), after the packer \(it runs in worker processes\), cannot be sent.*lock.*worker_count=0"):
        loader(2, ops)
    assert len(list(loader(0, ops))) > 50
