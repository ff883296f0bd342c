"""TFRecordIterDataset: Grain's cases, several files interleaved, restores at every step
(one seek), composes with interleave and window shuffle, bad files named, nothing left open."""

from __future__ import annotations

import io
import os
import threading

import pytest

import dataloader as dl
from tests.helpers import (
    assert_restores_everywhere,
    assert_streams_equal,
    open_files_under,
    wait_until,
)
from tests.sources.test_tfrecord import MORRIS, MORRIS_FILE

TFRecord = dl.experimental.TFRecordIterDataset


def write_shards(folder, count=3, records=10) -> list[str]:
    paths = []
    for f in range(count):
        paths.append(str(folder / f"shard-{f}.tfrecord"))
        dl.write_tfrecord(paths[-1], [b"f%d-r%d" % (f, r) * (r % 4 + 1) for r in range(records)])
    return paths


def test_a_file_tensorflow_wrote_reads_as_in_grain(tmp_path):
    (tmp_path / "morris.tfrecord").write_bytes(MORRIS_FILE)
    assert list(TFRecord(str(tmp_path / "morris.tfrecord"))) == MORRIS


def test_an_empty_file_has_no_records_and_a_missing_one_is_named(tmp_path):
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    assert list(TFRecord(str(tmp_path / "empty.tfrecord"))) == []
    with pytest.raises(FileNotFoundError, match="non_existent_file"):
        TFRecord(str(tmp_path / "non_existent_file.tfrecord"))


def test_a_file_that_is_not_tfrecord_is_named_at_construction(tmp_path):
    (tmp_path / "one_byte.tfrecord").write_bytes(b"1")
    with pytest.raises(ValueError, match=r"one_byte\.tfrecord' is truncated"):
        TFRecord(str(tmp_path / "one_byte.tfrecord"))
    (tmp_path / "text.tfrecord").write_bytes(b"some text that is certainly no TFRecord")
    with pytest.raises(ValueError, match=r"text\.tfrecord' is not a TFRecord file"):
        TFRecord(str(tmp_path / "text.tfrecord"))


def test_corruption_in_the_middle_of_a_file_names_the_file_and_offset(tmp_path):
    data = bytearray(MORRIS_FILE)
    data[-6] ^= 0xFF  # inside the last record's data, at byte offset 78
    (tmp_path / "corrupt.tfrecord").write_bytes(bytes(data))
    it = iter(TFRecord(str(tmp_path / "corrupt.tfrecord")))
    assert [next(it) for _ in range(4)] == MORRIS[:4]
    with pytest.raises(ValueError, match=r"corrupt\.tfrecord': the data of the record at byte offset 78 .* CRC"):
        next(it)


def test_a_file_truncated_in_the_middle_names_the_file_and_offset(tmp_path):
    (tmp_path / "cut.tfrecord").write_bytes(MORRIS_FILE[:-3])
    it = iter(TFRecord(str(tmp_path / "cut.tfrecord")))
    assert [next(it) for _ in range(4)] == MORRIS[:4]
    with pytest.raises(ValueError, match=r"cut\.tfrecord' is truncated: the record at byte offset 78"):
        next(it)


@pytest.mark.parametrize("count", [1, 4])
def test_it_restores_at_every_step_with_one_seek(tmp_path, count):
    paths = write_shards(tmp_path, count=count)
    outputs = assert_restores_everywhere(lambda: iter(TFRecord(paths)), limit=10 * count + 1, fresh_iterator_every=2)
    assert sorted(outputs) == sorted(b"f%d-r%d" % (f, r) * (r % 4 + 1) for f in range(count) for r in range(10))
    it = iter(TFRecord(paths[0]))
    next(it)
    assert it.get_state() == {"path": "shard-0.tfrecord", "reader_offset": 12 + 5 + 4}


def test_several_files_are_interleaved_one_record_from_each_in_turn(tmp_path):
    write_shards(tmp_path, count=3, records=2)
    assert list(TFRecord(os.path.join(tmp_path, "shard-*.tfrecord"))) == [
        b"f0-r0", b"f1-r0", b"f2-r0", b"f0-r1f0-r1", b"f1-r1f1-r1", b"f2-r1f2-r1"]


def pipeline(paths, workers=0):
    files = dl.MapDataset.source(paths).seed(3).shuffle().repeat(2)
    ds = dl.experimental.InterleaveIterDataset(files.map(TFRecord), cycle_length=2)
    return (dl.experimental.WindowShuffleIterDataset(ds, window_size=5, seed=3)
            .map(len).batch(3).mp_prefetch(dl.MultiprocessingOptions(num_workers=workers)))


def test_it_composes_with_interleave_and_window_shuffle_whatever_the_workers(tmp_path):
    paths = write_shards(tmp_path, count=3)
    outputs = [list(pipeline(paths, w)) for w in (0, 2)]
    assert_streams_equal(outputs[0], outputs[1])
    assert sum(len(b) for b in outputs[0]) == 60
    assert_restores_everywhere(lambda: iter(pipeline(paths)), limit=20, fresh_iterator_every=3)


def test_a_state_of_another_file_is_refused(tmp_path):
    paths = write_shards(tmp_path, count=2)
    it = iter(TFRecord(paths[0]))
    next(it)
    with pytest.raises(dl.StateMismatchError, match=r"'shard-0\.tfrecord', not 'shard-1\.tfrecord'"):
        iter(TFRecord(paths[1])).set_state(it.get_state())
    with pytest.raises(ValueError, match="offset 10000 is outside TFRecord file"):
        it.set_state({"path": "shard-0.tfrecord", "reader_offset": 10000})


def test_no_file_or_thread_is_left_open_after_close(tmp_path):
    paths = write_shards(tmp_path, count=20)
    before = set(threading.enumerate())
    with iter(TFRecord(paths)) as it:
        for _ in range(25):
            next(it)
        # the 16 files of the cycle, and the one a thread opens ahead
        assert wait_until(lambda: len(open_files_under(tmp_path)) == 16 + 1)
    assert not open_files_under(tmp_path)
    assert wait_until(lambda: set(threading.enumerate()) <= before)


def test_a_subclass_that_reads_urls_its_own_way_works_as_maxtexts_gcs_reader(tmp_path):
    """MaxText reads gs:// TFRecord files by subclassing the dataset (``__iter__`` reads
    ``self._path``) and Grain's private iterator (``self._reader`` set to its own file
    object). The URL is neither globbed nor opened at construction."""
    from dataloader.compat.tfrecord import _TFRecordDatasetIterator, _TFRecordReader

    local = tmp_path / "remote.tfrecord"
    dl.write_tfrecord(str(local), [b"first", b"second", b"third"])
    blobs = {"gs://bucket/data/remote.tfrecord": local.read_bytes()}

    class BlobReader(_TFRecordReader):
        def __init__(self, path):  # skips the parent's open(), as MaxText's does
            self._reader = io.BytesIO(blobs[path])

    class BlobIterator(_TFRecordDatasetIterator):
        def __init__(self, path):
            dl.DatasetIterator.__init__(self)
            self._reader = BlobReader(path)

    class BlobTFRecordIterDataset(dl.experimental.TFRecordIterDataset):
        def __iter__(self):
            return BlobIterator(self._path)

    ds = BlobTFRecordIterDataset("gs://bucket/data/remote.tfrecord")
    assert ds._path == "gs://bucket/data/remote.tfrecord"
    it = iter(ds)
    assert next(it) == b"first"
    state = it.get_state()
    assert list(it) == [b"second", b"third"]
    again = iter(ds)
    again.set_state(state)
    assert list(again) == [b"second", b"third"]
    assert iter(dl.experimental.TFRecordIterDataset(str(local))).__next__() == b"first"
    assert dl.experimental.TFRecordIterDataset(str(local))._path == str(local)
