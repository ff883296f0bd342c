"""Element-wise calls after an iterator-level stage run on the worker pool under
``mp_prefetch``: the parent iterates the stage and ships units of its elements, the
workers compute them, and the output and every state are the same for 0, 1, 2 and
``"auto"`` workers (:mod:`dataloader.dataset.transformations.pooled`)."""

from __future__ import annotations

import gzip
import json
import os
import signal

import numpy as np
import pytest

import dataloader as dl
from dataloader.dataset.base import DatasetIterator, IterDataset
from tests.helpers import assert_restores_everywhere, assert_streams_equal, take
from tests.integration.conftest import no_leaks  # noqa: F401  (autouse: no child or block left)

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]

MD = dl.MapDataset
WORKERS = (0, 1, 2, "auto")


def on_workers(ds, workers):
    return ds.mp_prefetch(dl.MultiprocessingOptions(num_workers=workers))


class Counting(IterDataset):
    """A user's dataset: ``{"x": [i, i + 1]}`` for i < n, with its own state."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def __iter__(self):
        return CountingIterator(self.n)


class CountingIterator(DatasetIterator):
    def __init__(self, n):
        super().__init__()
        self._i, self._n = 0, n

    def __next__(self):
        if self._i >= self._n:
            raise StopIteration
        self._i += 1
        return {"x": np.asarray([self._i - 1, self._i], dtype=np.int64)}

    def get_state(self):
        return {"i": self._i}

    def set_state(self, state):
        self._i = state["i"]


def rows(n):
    return MD.range(n).map(lambda i: {"x": np.arange(1 + i % 5) + i}).to_iter_dataset()


def packed_then_map(n=300):
    packed = dl.experimental.FirstFitPackIterDataset(rows(n), length_struct={"x": 8}, num_packing_bins=2)
    return packed.map(lambda row: {**row, "y": row["x"] * 3 + row["x_segment_ids"]})


def shuffled_then_filter(n=400):
    shuffled = dl.experimental.WindowShuffleIterDataset(MD.range(n).to_iter_dataset(), window_size=17, seed=3)
    return shuffled.filter(lambda x: x % 3 != 0)


def mixed_then_flat_map(n=150):
    mixed = IterDataset.mix({"a": MD.range(n).to_iter_dataset(), "b": Counting(n).map(lambda d: int(d["x"][1]) * 1000)},
                            {"a": 2, "b": 1})
    return mixed.flat_map(lambda x: [x] * (x % 3))


def own_then_map_batch(n=301):
    return Counting(n).map(lambda d: {"x": d["x"] * 2}).seed(7).random_map(
        lambda d, rng: {**d, "r": rng.integers(1000)}).batch(4)


def gzip_tfrecord(folder, n=250):
    path = folder / "data.tfrecord"
    dl.write_tfrecord(str(path), [b"r%04d" % i + b"x" * (i % 13) for i in range(n)])
    gz = folder / "data.tfrecord.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    return dl.experimental.TFRecordIterDataset(str(gz)).map(lambda b: (len(b), bytes(b[:5])))


def two_pooled_stages(n=400):
    """A map after a user's dataset, a packer, a map after the packer: a pool each."""
    inner = Counting(n).map(lambda d: {"x": np.arange(1 + int(d["x"][0]) % 5) + int(d["x"][0])})
    packed = dl.experimental.FirstFitPackIterDataset(inner, length_struct={"x": 8}, num_packing_bins=2)
    return packed.map(lambda r: {**r, "y": r["x"] * 2}).batch(3)


PIPELINES = {
    "packer -> map": lambda tmp: packed_then_map(),
    "window shuffle -> filter": lambda tmp: shuffled_then_filter(),
    "mix -> flat_map": lambda tmp: mixed_then_flat_map(),
    "own dataset -> map -> batch": lambda tmp: own_then_map_batch(),
    "gzip TFRecord -> map": gzip_tfrecord,
    "own dataset -> map -> packer -> map -> batch": lambda tmp: two_pooled_stages(),
}


def run(ds):
    """Every element and the state after each one (JSON, as a checkpoint keeps it)."""
    it = iter(ds)
    states, out = [json.dumps(it.get_state())], []
    for x in it:
        out.append(x)
        states.append(json.dumps(it.get_state()))
    it.close()
    return out, states


@pytest.mark.parametrize("name", list(PIPELINES))
def test_same_output_and_states_for_every_worker_count(name, tmp_path):
    ds = PIPELINES[name](tmp_path)
    plain, _ = run(ds)  # element by element, in this process: the output does not change
    reference, reference_states = run(on_workers(ds, 0))
    assert len(reference) > 20
    assert_streams_equal(reference, plain)
    for workers in WORKERS[1:]:
        out, states = run(on_workers(ds, workers))
        assert_streams_equal(out, reference)
        assert states == reference_states, f"states differ with {workers} workers"


@pytest.mark.parametrize("name", list(PIPELINES))
def test_restores_at_several_steps_with_another_worker_count(name, tmp_path):
    ds = PIPELINES[name](tmp_path)
    reference, states = run(on_workers(ds, 2))
    for k in (0, 1, 7, len(reference) // 2, len(reference) - 1, len(reference)):
        for workers in (0, 1):
            with iter(on_workers(ds, workers)) as it:
                it.set_state(json.loads(states[k]))
                assert_streams_equal(take(it, 10), reference[k : k + 10])


def test_the_map_after_a_packer_runs_in_the_workers():
    ds = dl.experimental.FirstFitPackIterDataset(rows(100), length_struct={"x": 8}, num_packing_bins=2)
    pids = {pid for pid in on_workers(ds.map(lambda row: os.getpid()), 2)}
    assert pids and os.getpid() not in pids
    assert {pid for pid in on_workers(ds.map(lambda row: os.getpid()), 0)} == {os.getpid()}


def test_a_state_of_the_element_by_element_stage_restores_on_the_pool():
    ds = mixed_then_flat_map()
    plain = iter(ds)
    take(plain, 11)  # inside the outputs of one element (flat_map gives 0 to 2 each)
    state = json.loads(json.dumps(plain.get_state()))
    rest = take(plain, 20)
    with iter(on_workers(ds, 2)) as it:
        it.set_state(state)
        assert_streams_equal(take(it, 20), rest)


def _kill_once(marker, x):
    """Kills its own process the first time it sees element 130 (with workers only)."""
    if x == 130 and os.getpid() != int(marker.read_text()) and not os.path.exists(f"{marker}.done"):
        open(f"{marker}.done", "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return x * 2


def test_a_killed_worker_changes_no_element(tmp_path):
    marker = tmp_path / "parent"
    marker.write_text(str(os.getpid()))
    ds = shuffled_then_filter().map(lambda x: _kill_once(marker, x))
    reference, states = run(on_workers(ds, 0))
    out, out_states = run(on_workers(ds, 2))
    assert os.path.exists(f"{marker}.done")  # a worker was killed on the way
    assert_streams_equal(out, reference)
    assert out_states == states


def _fail_on_long_row(row):
    if 600 in row["x"].tolist():  # the first segment of record 600, in row 242
        raise ValueError("record 600")
    return row


@pytest.mark.parametrize("workers", [0, 2])
def test_an_error_after_a_packer_names_the_map_and_comes_at_its_place(workers):
    packed = dl.experimental.FirstFitPackIterDataset(rows(900), length_struct={"x": 8}, num_packing_bins=2)
    expected = []
    for row in packed:
        if 600 in row["x"].tolist():
            break
        expected.append(row)
    assert len(expected) > 100
    it = iter(on_workers(packed.map(_fail_on_long_row), workers))
    out = take(it, len(expected))
    with pytest.raises(dl.PipelineError, match=r"_fail_on_long_row\) failed .*ValueError: record 600") as caught:
        next(it)
    assert_streams_equal(out, expected)
    assert caught.value.position == len(expected)  # the packed row's place in the stream
    it.close()


class FailingIterator(CountingIterator):
    def __next__(self):
        x = super().__next__()
        if int(x["x"][0]) == 100:
            raise KeyError("record 100 is gone")
        return x


class Failing(Counting):
    def __iter__(self):
        return FailingIterator(self.n)


def test_an_error_in_the_iterated_stage_comes_after_the_elements_before_it():
    for workers in (0, 2):
        it = iter(on_workers(Failing(300).map(lambda d: int(d["x"][0])), workers))
        out = take(it, 100)
        with pytest.raises(KeyError, match="record 100 is gone"):
            next(it)
        it.close()
        assert out == list(range(100))


def test_an_endless_file_list_feeds_the_workers(tmp_path):
    """A file list repeated without a count has no random-access form; the map after its
    interleave runs on the workers all the same, with the same output and states."""
    paths = []
    for f in range(3):
        paths.append(str(tmp_path / f"part-{f}.tfrecord"))
        dl.write_tfrecord(paths[-1], [b"%d-%03d" % (f, r) for r in range(20 + f)])
    files = MD.source(paths).repeat().map(dl.experimental.TFRecordIterDataset)
    ds = dl.experimental.InterleaveIterDataset(files, cycle_length=2).map(lambda b: bytes(b).upper())
    assert type(ds).__name__ == "ElementwiseIterDataset"  # not lowered onto the engine
    reference = iter(on_workers(ds, 0))
    expected = take(reference, 200)
    state = json.dumps(reference.get_state())
    after = take(reference, 30)
    reference.close()
    with iter(on_workers(ds, 2)) as it:
        assert take(it, 200) == expected
        assert json.dumps(it.get_state()) == state
    with iter(on_workers(ds, 1)) as it:
        it.set_state(json.loads(state))
        assert take(it, 30) == after


def test_a_state_of_the_pool_restores_without_workers():
    ds = own_then_map_batch()
    reference, states = run(on_workers(ds, 2))
    for k in (0, 3, 17, len(reference) - 1):  # 17 batches: the middle of a unit of 64
        it = iter(ds)  # element by element, in this process
        it.set_state(json.loads(states[k]))
        assert_streams_equal(take(it, 5), reference[k : k + 5])


def test_granary_worker_count_sends_the_map_after_a_packer_to_the_workers(monkeypatch):
    """Code that never calls mp_prefetch (torchtitan's loader) gets workers from the
    environment, for the calls after an iterator-level stage too."""
    ds = dl.experimental.FirstFitPackIterDataset(rows(100), length_struct={"x": 8}, num_packing_bins=2)
    ds = ds.map(lambda row: os.getpid())
    assert set(ds) == {os.getpid()}
    monkeypatch.setenv("GRANARY_WORKER_COUNT", "2")
    with iter(ds) as it:
        pids = set(it)
    assert pids and os.getpid() not in pids


def test_restores_at_every_step_with_workers():
    ds = on_workers(mixed_then_flat_map(), 2)
    outputs = assert_restores_everywhere(lambda: iter(ds), limit=30, fresh_iterator_every=10)
    assert_streams_equal(outputs, run(mixed_then_flat_map())[0][:30])
