"""Tests for ArrayRecordDataSource."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

from dataloader.sources import ArrayRecordDataSource, RandomAccessDataSource, write_array_record
from tests.helpers import run_threads
from tests.sources._child import read_in_child
from tests.sources._data import record


@pytest.fixture
def two_files(make_array_record):
    """Files of 7 and 5 records: global indices 0-6 and 7-11."""
    return [make_array_record("a.array_record", 7, 0), make_array_record("b.array_record", 5, 1)]


def _expected_two_files(index: int) -> bytes:
    return record(0, index) if index < 7 else record(1, index - 7)


def test_single_file_round_trips(make_array_record):
    source = ArrayRecordDataSource(make_array_record("one.array_record", 20))
    assert len(source) == 20
    assert [source[i] for i in range(20)] == [record(0, i) for i in range(20)]


def test_source_satisfies_protocol(make_array_record):
    source = ArrayRecordDataSource(make_array_record("one.array_record", 2))
    assert isinstance(source, RandomAccessDataSource)


def test_list_of_files_numbers_records_file_after_file(two_files):
    source = ArrayRecordDataSource(two_files)
    assert len(source) == 12
    assert source.num_records_per_file == (7, 5)
    assert [source[i] for i in range(12)] == [_expected_two_files(i) for i in range(12)]


def test_record_location_names_the_file_and_the_record_in_it(two_files):
    source = ArrayRecordDataSource(two_files)
    assert source.record_location(2) == f"file {str(two_files[0])!r} (record 2 of its 7)"
    assert source.record_location(8) == f"file {str(two_files[1])!r} (record 1 of its 5)"
    with pytest.raises(IndexError):
        source.record_location(12)


def test_list_order_is_kept(two_files):
    source = ArrayRecordDataSource(two_files[::-1])
    assert source[0] == record(1, 0)
    assert source[5] == record(0, 0)


def test_glob_reads_files_in_sorted_order(two_files, tmp_path):
    source = ArrayRecordDataSource(str(tmp_path / "*.array_record"))
    assert source.paths == tuple(str(p) for p in two_files)
    assert source[7] == record(1, 0)


def test_getitems_keeps_order_duplicates_across_file_boundary(two_files):
    source = ArrayRecordDataSource(two_files)
    indices = [11, 6, 7, 6, 0, 11, 8]
    assert source.__getitems__(indices) == [_expected_two_files(i) for i in indices]


def test_getitems_accepts_int64_array_on_single_file(make_array_record):
    source = ArrayRecordDataSource(make_array_record("one.array_record", 9))
    indices = np.array([8, 2, 2, 5], dtype=np.int64)
    assert source.__getitems__(indices) == [record(0, i) for i in indices.tolist()]


def test_getitem_accepts_numpy_integer(two_files):
    assert ArrayRecordDataSource(two_files)[np.int64(8)] == record(1, 1)


def test_concurrent_reads_from_threads_are_correct(make_array_record):
    source = ArrayRecordDataSource(make_array_record("one.array_record", 300))
    failures = []

    def read(seed: int) -> None:
        indices = np.random.default_rng(seed).integers(0, 300, 400)
        if source.__getitems__(indices) != [record(0, i) for i in indices.tolist()]:
            failures.append(seed)

    run_threads(read, 6)
    assert failures == []


def test_pickled_source_reads_in_same_process(two_files):
    source = ArrayRecordDataSource(two_files)
    source[0]  # opens a reader, which must not travel in the pickle
    clone = pickle.loads(pickle.dumps(source))
    assert clone.__getitems__([9, 1]) == [record(1, 2), record(0, 1)]
    assert repr(clone) == repr(source)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)  # spawned interpreters: seconds idle, far more on a loaded machine
def test_source_reads_in_spawned_process(two_files):
    source = ArrayRecordDataSource(two_files)
    source[3]
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pid, records = pool.apply_async(read_in_child, (source, [10, 2])).get(timeout=240)
    assert pid != os.getpid()
    assert records == [record(1, 3), record(0, 2)]


@pytest.mark.multiprocess
@pytest.mark.timeout(300)  # spawned interpreters: seconds idle, far more on a loaded machine
def test_source_reopens_readers_in_forked_process(tmp_path):
    """A fork inherits open readers; the child must open its own.

    The fork happens in a fresh interpreter: forking the test process itself, where JAX
    and other tests may have started threads, can deadlock. The files are uncompressed:
    after a read of zstd chunks, riegeli (under array_record) starts a background thread
    that recycles decompressors, and a fork taken while it holds its lock leaves the
    child's next reader waiting for ever (2 runs in 10 here). granary never forks a
    process that has read records (its workers come from a fresh fork server).
    """
    two_files = [tmp_path / "a.array_record", tmp_path / "b.array_record"]
    for number, (path, count) in enumerate(zip(two_files, (7, 5))):
        write_array_record(path, [record(number, i) for i in range(count)], options="uncompressed")
    script = textwrap.dedent(
        f"""
        import multiprocessing, os, sys
        from dataloader.sources import ArrayRecordDataSource
        source = ArrayRecordDataSource({[str(p) for p in two_files]!r})
        parent = source[8]
        def read(indices):
            return os.getpid(), source.__getitems__(indices)
        with multiprocessing.get_context("fork").Pool(1) as pool:
            pid, records = pool.apply_async(read, ([8, 0],)).get(timeout=240)
        assert pid != os.getpid()
        assert records == [parent, source[0]], records
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_close_then_read_reopens(make_array_record):
    with ArrayRecordDataSource(make_array_record("one.array_record", 3)) as source:
        assert source[1] == record(0, 1)
        source.close()
        assert source[2] == record(0, 2)


def test_repr_names_paths_and_record_count(make_array_record):
    path = make_array_record("one.array_record", 3)
    assert repr(ArrayRecordDataSource(path)) == (
        f"ArrayRecordDataSource(paths=[{str(path)!r}], num_records=3)"
    )


def test_repr_abbreviates_many_paths(make_array_record, tmp_path):
    for i in range(6):
        make_array_record(f"part{i}.array_record", 1, i)
    text = repr(ArrayRecordDataSource(str(tmp_path / "part*.array_record")))
    assert "... 3 more ..." in text
    assert text.endswith(f"{str(tmp_path / 'part5.array_record')!r}], num_records=6)")


def test_group_size_above_one_warns_once_per_file(make_array_record):
    paths = [
        make_array_record("g4.array_record", 8, group_size=4),
        make_array_record("g1.array_record", 8),
        make_array_record("g2.array_record", 8, group_size=2),
    ]
    with pytest.warns(UserWarning, match=r"Rewrite it with group_size=1") as caught:
        source = ArrayRecordDataSource(paths)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2
    assert "g4.array_record' was written with group_size=4" in messages[0]
    assert "g2.array_record' was written with group_size=2" in messages[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pickle.loads(pickle.dumps(source))[3] == record(0, 3)


def test_group_sizes_are_given_per_file_in_paths_order(make_array_record):
    paths = [
        make_array_record("g4.array_record", 8, group_size=4),
        make_array_record("g1.array_record", 8),
        make_array_record("g2.array_record", 8, group_size=2),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        source = ArrayRecordDataSource(paths)
    assert source.group_sizes == (4, 1, 2)
    assert pickle.loads(pickle.dumps(source)).group_sizes == (4, 1, 2)


def test_group_size_one_does_not_warn(make_array_record):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ArrayRecordDataSource(make_array_record("g1.array_record", 2))


def test_missing_file_is_named(tmp_path):
    path = tmp_path / "nope.array_record"
    with pytest.raises(
        FileNotFoundError, match=r"ArrayRecord file '.*nope\.array_record' does not exist"
    ):
        ArrayRecordDataSource(path)


def test_glob_matching_nothing_is_named(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"glob pattern '.*\*\.array_record' matches no file"
    ):
        ArrayRecordDataSource(str(tmp_path / "*.array_record"))


def test_empty_path_list_is_refused():
    with pytest.raises(ValueError, match="paths is an empty list; pass at least one ArrayRecord"):
        ArrayRecordDataSource([])


def test_zero_byte_file_is_named(tmp_path):
    path = tmp_path / "empty.array_record"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=r"'.*empty\.array_record' is empty \(0 bytes\)"):
        ArrayRecordDataSource(path)


def test_file_without_records_is_named(tmp_path):
    path = tmp_path / "zero.array_record"
    write_array_record(path, [])
    with pytest.raises(ValueError, match=r"'.*zero\.array_record' has no records"):
        ArrayRecordDataSource(path)


def test_file_of_another_format_is_named(tmp_path):
    path = tmp_path / "text.array_record"
    path.write_bytes(b"this is not an array record file\n" * 10)
    with pytest.raises(
        ValueError, match=r"'.*text\.array_record' is not a readable ArrayRecord file"
    ):
        ArrayRecordDataSource(path)


def test_index_out_of_range_names_index_and_length(two_files):
    with pytest.raises(IndexError, match=r"index 12 is out of range for a source of length 12"):
        ArrayRecordDataSource(two_files)[12]


def test_getitems_out_of_range_names_index_and_length(two_files):
    with pytest.raises(IndexError, match=r"index 40 is out of range for a source of length 12"):
        ArrayRecordDataSource(two_files).__getitems__(np.array([1, 40]))


def test_float_index_is_refused(two_files):
    with pytest.raises(TypeError, match=r"must be an integer, got float 1\.0"):
        ArrayRecordDataSource(two_files)[1.0]


# reader_options: Grain's second argument, which MaxText always passes.

_OFFLOADED = {"index_storage_option": "offloaded"}


@pytest.mark.parametrize("options", [None, {}, {"index_storage_option": "in_memory"}, _OFFLOADED])
def test_reader_options_as_maxtext_passes_them_read_the_same_records(two_files, options):
    source = ArrayRecordDataSource(paths=two_files, reader_options=options)
    indices = [11, 0, 7, 6, 6, 3]
    assert [source[i] for i in range(12)] == [_expected_two_files(i) for i in range(12)]
    assert source.__getitems__(indices) == [_expected_two_files(i) for i in indices]


def test_offloaded_index_reads_what_in_memory_reads(make_array_record):
    path = make_array_record("big.array_record", 2000)
    in_memory = ArrayRecordDataSource(path, {"index_storage_option": "in_memory"})
    offloaded = ArrayRecordDataSource(path, _OFFLOADED)
    indices = np.random.default_rng(0).integers(0, 2000, 500)
    assert offloaded.__getitems__(indices) == in_memory.__getitems__(indices)
    assert offloaded[1999] == record(0, 1999)


def test_reader_options_reach_every_reader_the_source_opens(two_files, monkeypatch):
    from dataloader.sources import array_record

    opened = []
    real = array_record.ArrayRecordReader
    monkeypatch.setattr(array_record, "ArrayRecordReader", lambda p, o, **k: opened.append(o) or real(p, o, **k))
    source = ArrayRecordDataSource(two_files, {"index_storage_option": "offloaded", "max_parallelism": "2"})
    clone = pickle.loads(pickle.dumps(source))
    clone.__getitems__([0, 11])
    # two files counted at construction, then both opened by the unpickled copy
    assert len(opened) == 4
    for options in opened:
        assert sorted(options.split(",")) == [
            "footer_prefetch_bytes:0", "index_storage_option:offloaded", "max_parallelism:2",
            "readahead_buffer_size:0",
        ]


@pytest.mark.multiprocess
@pytest.mark.timeout(300)  # spawned interpreters: seconds idle, far more on a loaded machine
def test_reader_options_reach_the_reader_in_a_spawned_process(two_files):
    from tests.sources._child import reader_options_in_child

    source = ArrayRecordDataSource(two_files, _OFFLOADED)
    source[0]
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pid, opened, got = pool.apply_async(reader_options_in_child, (source, 9)).get(timeout=240)
    assert pid != os.getpid()
    assert got == record(1, 2)
    assert len(opened) == 1 and "index_storage_option:offloaded" in opened[0].split(",")


def test_pickled_copy_keeps_reader_options_repr_and_equality(two_files):
    source = ArrayRecordDataSource(two_files, _OFFLOADED)
    clone = pickle.loads(pickle.dumps(source))
    assert clone.reader_options == {"index_storage_option": "offloaded"}
    assert clone == source and hash(clone) == hash(source)
    assert repr(clone) == repr(source)
    assert repr(source).endswith("num_records=12, reader_options={'index_storage_option': 'offloaded'})")
    assert clone != ArrayRecordDataSource(two_files)


def test_reader_options_given_are_kept_as_str(two_files):
    options = {"readahead_buffer_size": 0, "max_parallelism": "auto"}
    source = ArrayRecordDataSource(two_files, options)
    assert source.reader_options == {"readahead_buffer_size": "0", "max_parallelism": "auto"}
    assert source[8] == record(1, 1)


def test_unknown_reader_option_is_refused_by_name(two_files):
    with pytest.raises(ValueError, match=r"reader_options key 'index_storage' is not an ArrayRecord reader option; "
                       r"the reader understands 'index_storage_option', 'readahead_buffer_size'"):
        ArrayRecordDataSource(two_files, {"index_storage": "offloaded"})


@pytest.mark.parametrize(("options", "match"), [
    ({"index_storage_option": "on_disk"}, r"reader_options\['index_storage_option'\] is 'on_disk'; pass 'in_memory' or 'offloaded'"),
    ({"index_storage_option": ""}, r"is ''; pass 'in_memory' or 'offloaded'"),
    ({"readahead_buffer_size": "16 MB"}, r"reader_options\['readahead_buffer_size'\] is '16 MB'; pass a byte count"),
    ({"max_parallelism": "-1"}, r"reader_options\['max_parallelism'\] is '-1'; pass a count"),
    ({"max_parallelism": "1,index_storage_option:offloaded"}, r"reader_options\['max_parallelism'\] is '1,index"),
    ({"index_storage_option": "offloaded", "footer_prefetch_bytes": "1M"}, r"footer_prefetch_bytes='1M' needs index_storage_option 'in_memory'"),
])
def test_reader_option_values_are_checked_at_construction(two_files, options, match):
    with pytest.raises(ValueError, match=match):
        ArrayRecordDataSource(two_files, options)


@pytest.mark.parametrize(("options", "match"), [
    ("index_storage_option:offloaded", r"reader_options must be a dict of str, got str"),
    ({"max_parallelism": True}, r"reader_options\['max_parallelism'\] must be a str, got bool True"),
    ({"index_storage_option": None}, r"reader_options\['index_storage_option'\] must be a str, got NoneType"),
])
def test_reader_options_of_the_wrong_type_are_refused(two_files, options, match):
    with pytest.raises(TypeError, match=match):
        ArrayRecordDataSource(two_files, options)
