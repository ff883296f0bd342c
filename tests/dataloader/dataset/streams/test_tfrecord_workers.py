"""TFRecord streams on the worker pool: ``TFRecordIterDataset(...).map(f)`` and the calls
chained after it run in worker processes, unit by unit, over an index of record offsets,
and give the records, the output, the states and the errors of the stream read in order,
for every worker count."""

from __future__ import annotations

import functools
import json
import os
import time

import pytest

import dataloader as dl
from dataloader.dataset.streams.tfrecord_source import TFRecordStreamSource, record_offsets
from tests.helpers import (
    assert_restores_everywhere,
    assert_streams_equal,
    open_files_under,
    take,
    wait_until,
)
from tests.integration.conftest import no_leaks  # noqa: F401  (autouse: no child or block left)
from tests.sources.test_tfrecord import MORRIS, MORRIS_FILE

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]

TFRecord = dl.experimental.TFRecordIterDataset
WORKERS = (0, 1, 2)


def on_workers(ds, workers):
    return ds.mp_prefetch(dl.MultiprocessingOptions(num_workers=workers))


def record(f, r):
    """Record ``r`` of file ``f``: its key, padded to a length that varies."""
    return b"%03d-%04d|" % (f, r) + b"x" * (r * 7 % 23)


def key(data):
    f, r = data.split(b"|")[0].split(b"-")
    return int(f), int(r)


def write_files(folder, counts):
    paths = []
    for f, n in enumerate(counts):
        paths.append(str(folder / f"shard-{f:02d}.tfrecord"))
        dl.write_tfrecord(paths[-1], [record(f, r) for r in range(n)])
    return paths


def labelled(data):
    return {"key": key(data), "size": len(data)}


def keep_some(data):
    return key(data)[1] % 3 != 1


def split(data):
    return [(*key(data), i) for i in range(key(data)[1] % 3)]


@pytest.fixture(params=["one_file", "files_of_different_lengths"])
def paths(request, tmp_path):
    counts = [23] if request.param == "one_file" else [7, 3, 12, 1, 0, 9, 4, 5, 2, 8, 6, 3, 3, 1, 10, 2, 4, 7, 5, 11]
    return write_files(tmp_path, counts)


CHAINS = {
    "map": lambda ds: ds.map(labelled),
    "filter_then_map": lambda ds: ds.filter(keep_some).map(labelled),
    "flat_map": lambda ds: ds.flat_map(split),
    "map_filter_batch": lambda ds: ds.map(key).filter(lambda k: k[1] % 2 == 0).batch(3),
}


def reference(paths, chain):
    """The chain at the iterator level, on the records the stream yields in order in
    this process (the way it ran before it ran on the engine)."""
    in_order = dl.experimental.ThreadPrefetchIterDataset(TFRecord(paths), prefetch_buffer_size=0)
    return list(CHAINS[chain](in_order))


def test_the_index_finds_every_record_of_the_stream(paths):
    records = list(TFRecord(paths))
    source = TFRecordStreamSource(paths, [record_offsets(p) for p in paths], 16)
    assert len(source) == len(records)
    assert source.__getitems__(range(len(records))) == records
    assert [source[p] for p in reversed(range(len(records)))] == records[::-1]
    assert source.__getitems__([5, 3, 4, 3]) == [records[5], records[3], records[4], records[3]]
    assert reference(paths, "flat_map") == [e for r in records for e in split(r)]


def test_a_run_of_positions_reads_each_files_bytes_once(tmp_path, monkeypatch):
    paths = write_files(tmp_path, [40, 24, 33])
    source = TFRecordStreamSource(paths, [record_offsets(p) for p in paths], 16)
    reads = []
    original = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, size, offset: reads.append((size, offset)) or original(fd, size, offset))
    records = source.__getitems__(range(10, 70))  # about 20 consecutive records of each file
    assert records == list(TFRecord(paths))[10:70]
    assert len(reads) == 3  # one contiguous range a file, from its first record's offset to its last's end
    lows = {f: min(r for g, r in map(key, records) if g == f) for f in range(3)}
    highs = {f: max(r for g, r in map(key, records) if g == f) + 1 for f in range(3)}
    starts = [record_offsets(p).starts for p in paths]
    assert sorted(reads) == sorted((int(starts[f][highs[f]] - starts[f][lows[f]]), int(starts[f][lows[f]]))
                                   for f in range(3))


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_every_element_is_the_streams_for_0_1_and_2_workers(paths, chain):
    expected = reference(paths, chain)
    assert expected
    for workers in WORKERS:
        ds = on_workers(CHAINS[chain](TFRecord(paths)), workers)
        assert type(ds).__name__ == "LoaderIterDataset"  # on the engine
        assert_streams_equal(list(ds), expected)


def test_the_stream_alone_under_mp_prefetch_is_the_stream(paths):
    expected = list(TFRecord(paths))
    for workers in WORKERS:
        assert list(on_workers(TFRecord(paths), workers)) == expected


def test_restores_at_every_step_in_process(paths):
    ds = TFRecord(paths).filter(keep_some).flat_map(split)
    outputs = assert_restores_everywhere(lambda: iter(ds), limit=40, fresh_iterator_every=4)
    assert outputs == [e for r in TFRecord(paths) if keep_some(r) for e in split(r)][:40]


def states_after_each_output(ds, workers):
    """Each output of ``ds`` on ``workers`` workers, with the state after it (as JSON)."""
    with iter(on_workers(ds, workers)) as it:
        return [(x, json.dumps(it.get_state())) for x in it]


def test_states_are_the_same_for_every_worker_count_and_restore_under_any_other(paths):
    chain = CHAINS["map_filter_batch"]
    expected = reference(paths, "map_filter_batch")
    runs = {w: states_after_each_output(chain(TFRecord(paths)), w) for w in WORKERS}
    for w in WORKERS:
        assert_streams_equal([x for x, _ in runs[w]], expected)
        assert [state for _, state in runs[w]] == [state for _, state in runs[0]]
    steps = sorted({0, 1, len(expected) // 2, len(expected) - 2})
    for saved_with, restored_with in ((2, 0), (0, 2), (1, 2)):
        for step in steps:
            resumed = iter(on_workers(chain(TFRecord(paths)), restored_with))
            resumed.set_state(json.loads(runs[saved_with][step][1]))
            rest = list(resumed)
            resumed.close()
            assert_streams_equal(rest, expected[step + 1:])


def test_random_map_draws_the_same_numbers_for_every_worker_count(paths):
    def noisy(data, rng):
        return key(data), int(rng.integers(1 << 30))

    outputs = [list(on_workers(TFRecord(paths).seed(11).random_map(noisy), w)) for w in WORKERS]
    assert outputs[1] == outputs[0] == outputs[2]
    assert [k for k, _ in outputs[0]] == [key(r) for r in TFRecord(paths)]
    assert len({n for _, n in outputs[0]}) > len(outputs[0]) // 2  # numbers drawn per record


def pid_and_key(parent, data):
    # In the test's process (a warm start computes the first units here while the
    # workers start), slow down, so that the workers take the rest of the stream.
    if os.getpid() == parent:
        time.sleep(0.01)
    return os.getpid(), key(data)


def test_a_worker_process_computes_the_map(tmp_path):
    paths = write_files(tmp_path, [300, 200, 250])
    out = list(on_workers(TFRecord(paths).map(functools.partial(pid_and_key, os.getpid())), 2))
    assert [k for _, k in out] == [key(r) for r in TFRecord(paths)]
    assert {pid for pid, _ in out} - {os.getpid()}


def test_states_of_the_streaming_iterators_continue_on_the_workers(paths):
    """A state saved while the stream ran in order (the file's or the interleave's, alone
    or under a map: Grain's and earlier granary checkpoints) continues at its record."""
    expected = [labelled(r) for r in TFRecord(paths)]
    steps = sorted({0, 1, 5, len(expected) // 2, len(expected)})
    saved = {}
    with iter(TFRecord(paths)) as streaming:
        for step in range(len(expected) + 1):
            if step in steps:  # the source's own state, and a map's over it
                saved[step] = [streaming.get_state(), {"parent": streaming.get_state(), "index": step, "skip": 0}]
            next(streaming, None)
    for step, states in saved.items():
        for state in states:
            resumed = iter(on_workers(TFRecord(paths).map(labelled), 2))
            resumed.set_state(json.loads(json.dumps(state)))
            assert_streams_equal(list(resumed), expected[step:])
            resumed.close()


def test_a_streaming_state_of_other_files_or_offsets_is_refused(tmp_path):
    paths = write_files(tmp_path, [5, 6, 7])
    with iter(TFRecord(paths[0])) as streaming:
        state = take(streaming, 2) and streaming.get_state()
    with pytest.raises(dl.StateMismatchError, match=r"'other\.tfrecord', not 'shard-01\.tfrecord'"):
        iter(TFRecord(paths[1]).map(labelled)).set_state({**state, "path": "other.tfrecord"})
    with pytest.raises(dl.StateMismatchError, match="offset 3 is not the start of a record"):
        iter(TFRecord(paths[0]).map(labelled)).set_state({**state, "reader_offset": 3})
    with pytest.raises(dl.StateMismatchError, match="state is of one TFRecord file but this stream reads 3 files"):
        iter(TFRecord(paths).map(labelled)).set_state(state)


def damaged_files(folder):
    """Damaged files, and the records the stream reads from each before it fails."""
    corrupt = bytearray(MORRIS_FILE)
    corrupt[-6] ^= 0xFF  # inside the last record's data, at byte offset 78
    bad_header = bytearray(MORRIS_FILE)
    bad_header[78 + 3] ^= 0xFF  # the last record's length field
    files = {"corrupt": bytes(corrupt), "cut": MORRIS_FILE[:-3], "header": bytes(bad_header),
             "cut_header": MORRIS_FILE + MORRIS_FILE[:5]}
    for name, data in files.items():
        (folder / f"{name}.tfrecord").write_bytes(data)
    return {name: str(folder / f"{name}.tfrecord") for name in files}


def stream_until_error(ds):
    """The outputs of ``ds`` until it fails, and its error (the test fails if none)."""
    out = []
    try:
        for x in ds:
            out.append(x)
    except (ValueError, dl.PipelineError) as error:
        return out, error
    raise AssertionError(f"{ds!r} ended without an error after {len(out)} outputs")


def damaged_streams(folder):
    """Streams over damaged files: each alone, and two beside a good file."""
    files = damaged_files(folder)
    good = str(folder / "good.tfrecord")
    dl.write_tfrecord(good, [b"g%d" % i for i in range(9)])
    return [*files.values(), [good, files["corrupt"], files["header"]]]


def test_damaged_files_fail_with_the_streams_error_for_0_1_and_2_workers(tmp_path):
    for paths in damaged_streams(tmp_path):
        expected, stream_error = stream_until_error(iter(TFRecord(paths)))
        assert isinstance(stream_error, ValueError)
        for workers in WORKERS:
            out, error = stream_until_error(on_workers(TFRecord(paths).map(bytes), workers))
            assert isinstance(error, dl.PipelineError)
            assert str(stream_error) in str(error)  # the stream's message: its file and byte offset
            assert isinstance(error.__cause__, ValueError) and str(error.__cause__) == str(stream_error)
            assert out == expected[:len(out)]


def test_damaged_files_fail_after_the_records_the_stream_yields(tmp_path):
    for paths in damaged_streams(tmp_path):
        expected, _ = stream_until_error(iter(TFRecord(paths)))
        for workers in WORKERS:
            out, _ = stream_until_error(on_workers(TFRecord(paths).map(bytes), workers))
            assert out == expected


def test_gzip_remote_and_own_reading_stay_in_order(tmp_path):
    """A gzip file has no offset to jump to (it is read from its start), so its stream and
    the calls on it run at the iterator level, as before; so do a subclass that reads its
    files its own way."""
    import gzip

    path = tmp_path / "data.tfrecord"
    dl.write_tfrecord(str(path), [b"a", b"bb"])
    (tmp_path / "data.tfrecord.gz").write_bytes(gzip.compress(path.read_bytes()))

    class OwnReading(TFRecord):
        def __iter__(self):
            return iter(dl.MapDataset.source([b"own"]).to_iter_dataset())

    for ds in (TFRecord(str(tmp_path / "data.tfrecord.gz")), TFRecord([str(path), str(tmp_path / "data.tfrecord.gz")]),
               OwnReading(str(path))):
        assert type(ds.map(len)).__name__ == "ElementwiseIterDataset"
    assert list(on_workers(TFRecord(str(tmp_path / "data.tfrecord.gz")).map(len), 2)) == [1, 2]
    assert list(OwnReading(str(path)).map(len)) == [3]
    assert type(TFRecord(str(path)).map(len)).__name__ == "LoaderIterDataset"


def test_a_file_that_tensorflow_wrote_reads_the_same_on_the_workers(tmp_path):
    (tmp_path / "morris.tfrecord").write_bytes(MORRIS_FILE)
    assert list(on_workers(TFRecord(str(tmp_path / "morris.tfrecord")).map(bytes), 2)) == MORRIS


def shuffled_files(paths, epochs=2):
    """MaxText's composition over TFRecord files: file order shuffled per epoch, one
    dataset a file, interleaved, records window-shuffled."""
    files = dl.MapDataset.source(paths).shuffle(seed=5).repeat(epochs).map(TFRecord)
    return dl.experimental.WindowShuffleIterDataset(
        dl.experimental.InterleaveIterDataset(files, cycle_length=3), window_size=10, seed=5)


def serial(ds):
    """``ds`` kept at the iterator level, read in order in this process (as it ran
    before it ran on the engine)."""
    return dl.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=0)


def test_shuffled_interleaved_files_run_on_the_workers_with_the_records_they_had_in_order(tmp_path):
    counts = [7, 3, 12, 1, 9]
    paths = write_files(tmp_path, counts)
    in_order = list(serial(shuffled_files(paths)))
    assert sorted(map(key, in_order)) == sorted([(f, r) for f, n in enumerate(counts) for r in range(n)] * 2)
    expected = [labelled(r) for r in in_order if keep_some(r)]
    for workers in WORKERS:
        ds = on_workers(shuffled_files(paths).filter(keep_some).map(labelled), workers)
        assert type(ds).__name__ == "LoaderIterDataset"  # on the engine
        assert_streams_equal(list(ds), expected)
    mixed = dl.experimental.InterleaveIterDataset([TFRecord(paths[0]), dl.MapDataset.range(3).to_iter_dataset()],
                                                  cycle_length=2)
    assert type(mixed.map(len)).__name__ == "ElementwiseIterDataset"  # not one TFRecord file each


def test_states_of_shuffled_interleaved_files_in_order_continue_on_the_workers(tmp_path):
    paths = write_files(tmp_path, [7, 3, 12, 1, 9])
    expected = list(shuffled_files(paths).map(labelled))
    steps = {0, 1, 9, 10, 11, len(expected) // 2, len(expected) - 1}
    states = {}
    with iter(serial(shuffled_files(paths)).map(labelled)) as streaming:
        for step in range(len(expected)):
            if step in steps:
                states[step] = json.loads(json.dumps(streaming.get_state()))
            next(streaming)
    for step, state in states.items():
        resumed = iter(on_workers(shuffled_files(paths).map(labelled), 2))
        resumed.set_state(state)
        assert_streams_equal(list(resumed), expected[step:])
        resumed.close()


def test_no_file_stays_open_once_the_pipeline_is_gone(tmp_path):
    import gc

    paths = write_files(tmp_path, [5, 6, 7])
    for workers in WORKERS:
        ds = on_workers(TFRecord(paths).map(labelled), workers)
        assert len(list(ds)) == 18
        del ds
        gc.collect()
        assert wait_until(lambda: not open_files_under(tmp_path))


def test_a_large_index_stays_behind_and_workers_read_the_headers_themselves(tmp_path, monkeypatch):
    import pickle

    from dataloader.dataset.streams import tfrecord_source

    paths = write_files(tmp_path, [7, 3, 12])
    expected = reference(paths, "map")
    monkeypatch.setattr(tfrecord_source, "SHIPPED_RECORDS", 5)
    source = TFRecordStreamSource(paths, [record_offsets(p) for p in paths], 16)
    travelled = pickle.loads(pickle.dumps(source))
    assert travelled._indexes == [None] * 3
    assert travelled.__getitems__(range(len(source))) == list(TFRecord(paths))
    for workers in WORKERS:
        assert_streams_equal(list(on_workers(TFRecord(paths).map(labelled), workers)), expected)
    dl.write_tfrecord(paths[1], [record(1, r) for r in range(4)])  # one more record than indexed
    changed = pickle.loads(pickle.dumps(source))
    with pytest.raises(ValueError, match=r"shard-01\.tfrecord' has 4 records now but had 3 when the pipeline"):
        changed.__getitems__(range(len(source)))


def test_a_file_rewritten_after_it_was_indexed_fails_and_is_named(tmp_path):
    path = str(tmp_path / "rewritten.tfrecord")
    dl.write_tfrecord(path, [b"aa", b"bb"])
    source = TFRecordStreamSource([path], [record_offsets(path)], 16)
    dl.write_tfrecord(path, [b"a", b"bbb"])  # the same size, records cut elsewhere
    with pytest.raises(ValueError, match=r"rewritten\.tfrecord' changed after it was indexed \(the record at byte offset 0"):
        source[0]
