"""``ReadOptions`` in Grain's units: threads read up to ``prefetch_buffer_size`` records (and
about ``prefetch_buffer_bytes``) ahead, and every operation runs in the consumer's thread
(:class:`dataloader.engine.in_process.ReadAhead`). None of it changes a batch or a state."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import dataloader as dl
from dataloader.errors import PipelineError
from tests.helpers import assert_restores_everywhere, assert_streams_equal, wait_until

pytestmark = pytest.mark.timeout(120)


class Recording:
    """``n`` records of ``size`` bytes (record ``i`` starts with ``i``); counts the reads,
    and fails on ``bad``."""

    def __init__(self, n: int, size: int = 8, bad: int | None = None) -> None:
        self.n, self.size, self.bad = n, size, bad
        self.reads: list[int] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        i = int(i)
        with self._lock:
            self.reads.append(i)
        if i == self.bad:
            raise OSError(f"record {i} is damaged")
        return i.to_bytes(4, "little") + bytes(self.size - 4)


def first(record: bytes) -> int:
    return int.from_bytes(record[:4], "little")


def settle() -> None:
    """Lets threads that should be idle now run on, if they wrongly would."""
    time.sleep(0.3)


def loader(source, read: dl.ReadOptions, batch: int = 4, ops=()) -> dl.DataLoader:
    return dl.DataLoader(source, dl.SequentialSampler(len(source)),
                         [dl.MapTransform(first), *ops, dl.Batch(batch)], read_options=read)


def test_at_most_prefetch_buffer_size_records_are_read_ahead():
    source = Recording(1000)
    it = iter(loader(source, dl.ReadOptions(num_threads=4, prefetch_buffer_size=37)))
    assert next(it).tolist() == [0, 1, 2, 3]
    assert wait_until(lambda: len(source.reads) == 4 + 37)
    settle()
    assert len(source.reads) == 4 + 37  # nothing more while the consumer takes nothing
    assert sorted(source.reads) == list(range(41))  # the records that come next
    next(it)
    assert wait_until(lambda: len(source.reads) == 8 + 37)
    it.close()


def test_the_byte_bound_holds_once_the_records_size_is_known():
    source = Recording(1000, size=1000)
    read = dl.ReadOptions(num_threads=4, prefetch_buffer_size=500, prefetch_buffer_bytes=10_000)
    it = iter(loader(source, read))
    next(it)
    assert wait_until(lambda: len(source.reads) == 4 + 10)
    settle()
    assert len(source.reads) == 4 + 10  # 10 records of 1000 bytes, not 500
    it.close()


def test_a_record_larger_than_the_byte_bound_still_comes_one_at_a_time():
    source = Recording(40, size=5000)
    read = dl.ReadOptions(num_threads=2, prefetch_buffer_size=50, prefetch_buffer_bytes=1000)
    it = iter(loader(source, read))
    assert [b.tolist() for b in it] == [list(range(k, k + 4)) for k in range(0, 40, 4)]


def test_operations_run_in_the_consumers_thread_only():
    seen = set()

    def where(x):
        seen.add(threading.get_ident())
        return x

    out = list(loader(Recording(200), dl.ReadOptions(num_threads=16, prefetch_buffer_size=500),
                      ops=[dl.MapTransform(where)]))
    assert len(out) == 50
    assert seen == {threading.get_ident()}


READS = [dl.ReadOptions(), dl.ReadOptions(num_threads=1, prefetch_buffer_size=1),
         dl.ReadOptions(num_threads=3, prefetch_buffer_size=10, prefetch_buffer_bytes=40),
         dl.ReadOptions(num_threads=16, prefetch_buffer_size=500)]


def _pipeline(read: dl.ReadOptions) -> dl.IterDataset:
    ds = dl.MapDataset.source(Recording(97)).shuffle(seed=4).repeat(2).to_iter_dataset(read)
    ds = ds.map(first).filter(lambda x: x % 3 != 0).flat_map(lambda x: [x] * (x % 2 + 1))
    return ds.batch(5)


@pytest.mark.parametrize("read", READS, ids=str)
def test_read_ahead_changes_no_batch_and_restores_at_every_step(read):
    reference = [b.tolist() for b in _pipeline(dl.ReadOptions())]
    assert [b.tolist() for b in _pipeline(read)] == reference
    outputs = assert_restores_everywhere(lambda: iter(_pipeline(read)), limit=40, fresh_iterator_every=3)
    assert_streams_equal(outputs, [np.asarray(b) for b in reference[:40]])


@pytest.mark.parametrize("read", READS[1:], ids=str)
def test_a_failing_read_is_named_at_its_record_as_without_read_ahead(read):
    it = iter(loader(Recording(40, bad=13), read))
    assert [next(it).tolist() for _ in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    with pytest.raises(PipelineError, match=r"record 13") as caught:
        next(it)
    assert caught.value.record_index == 13


def test_grains_read_options_keep_grains_names_and_meaning():
    read = dl.ReadOptions(num_threads=16, prefetch_buffer_size=500)
    assert (read.num_threads, read.prefetch_buffer_size) == (16, 500)
    assert dl.ReadOptions().prefetch_buffer_size == 500  # Grain's default count
    with pytest.raises(ValueError, match=r"ReadOptions.prefetch_buffer_bytes must be an integer >= 1, got 0"):
        dl.ReadOptions(prefetch_buffer_bytes=0)
