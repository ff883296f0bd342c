"""What the loader computes: the order, the operations, the batches, the errors."""

from __future__ import annotations

import numpy as np
import pytest

import dataloader as dl
from tests.dataloader.pipelines import make_loader
from tests.helpers import assert_streams_equal, two_array_record_files


class CountingSource:
    """An in-memory source that counts the records read (to prove O(1) restore)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.reads = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        self.reads += 1
        return int(i)

    def __getitems__(self, indices):
        self.reads += len(indices)
        return [int(i) for i in indices]


def keys_of(sampler, count):
    return sampler.record_keys(np.arange(count, dtype=np.int64)).tolist()


def test_batches_follow_the_sampler_order_through_the_map():
    sampler = dl.IndexSampler(50, shuffle=True, seed=3, num_epochs=2)
    loader = dl.DataLoader(dl.RangeDataSource(50), sampler, [dl.MapTransform(lambda x: x * 10), dl.Batch(8)])
    batches = [b.tolist() for b in loader]
    flat = [x for b in batches for x in b]
    assert flat == [10 * k for k in keys_of(sampler, 100)]
    assert [len(b) for b in batches] == [8] * 12 + [4]


def test_drop_remainder_drops_only_the_last_partial_batch():
    sampler = dl.IndexSampler(50, shuffle=False, num_epochs=2)
    loader = dl.DataLoader(dl.RangeDataSource(50), sampler, [dl.Batch(8, drop_remainder=True)])
    batches = [b.tolist() for b in loader]
    assert len(batches) == 12 and batches[6] == [48, 49, 0, 1, 2, 3, 4, 5]


def test_each_epoch_is_a_permutation_of_the_records():
    sampler = dl.IndexSampler(40, shuffle=True, seed=5, num_epochs=3)
    out = list(dl.DataLoader(dl.RangeDataSource(40), sampler))
    for e in range(3):
        assert sorted(out[40 * e : 40 * (e + 1)]) == list(range(40))
    assert out[:40] != out[40:80]


def test_filter_then_batch_regroups_the_survivors_in_order():
    sampler = dl.IndexSampler(30, shuffle=True, seed=1, num_epochs=1)
    loader = dl.DataLoader(
        dl.RangeDataSource(30), sampler, [dl.FilterTransform(lambda x: x % 4 != 0), dl.Batch(5)]
    )
    expected = [k for k in keys_of(sampler, 30) if k % 4 != 0]
    batches = [b.tolist() for b in loader]
    assert [x for b in batches for x in b] == expected
    assert [len(b) for b in batches][:-1] == [5] * (len(batches) - 1)


def test_flat_map_expands_each_element_in_order():
    sampler = dl.SequentialSampler(5)
    loader = dl.DataLoader(dl.RangeDataSource(5), sampler, [dl.FlatMapTransform(lambda x: [x] * x)])
    assert list(loader) == [1, 2, 2, 3, 3, 3, 4, 4, 4, 4]


def test_random_map_gets_the_generator_of_its_seed_position_and_stream():
    sampler = dl.IndexSampler(10, shuffle=True, seed=11, num_epochs=2)
    loader = dl.DataLoader(
        dl.RangeDataSource(10), sampler,
        [dl.MapTransform(lambda x: x), dl.RandomMapTransform(lambda x, rng: rng.random())],
    )
    got = list(loader)
    expected = [dl.record_rng(11, g, 1, 0).random() for g in range(20)]
    assert got == expected


def test_random_augmentations_differ_between_epochs_and_records():
    sampler = dl.IndexSampler(10, shuffle=False, seed=11, num_epochs=2)
    loader = dl.DataLoader(dl.RangeDataSource(10), sampler, [dl.RandomMapTransform(lambda x, rng: rng.random())])
    got = list(loader)
    assert len(set(got)) == 20


def test_two_runs_give_identical_batches():
    a = list(make_loader("everything"))
    b = list(make_loader("everything"))
    assert_streams_equal(a, b)


def test_shards_interleave_the_global_stream():
    outs = []
    for h in range(3):
        sampler = dl.IndexSampler(10, shard_options=dl.ShardOptions(h, 3), shuffle=True, seed=2, num_epochs=3)
        outs.append(list(dl.DataLoader(dl.RangeDataSource(10), sampler)))
    whole = list(dl.DataLoader(dl.RangeDataSource(10), dl.IndexSampler(10, shuffle=True, seed=2, num_epochs=3)))
    assert [outs[g % 3][g // 3] for g in range(30)] == whole


def test_loader_shard_options_apply_to_an_unsharded_sampler():
    sampler = dl.IndexSampler(10, shuffle=False, num_epochs=1)
    loader = dl.DataLoader(dl.RangeDataSource(10), sampler, shard_options=dl.ShardOptions(1, 2))
    assert list(loader) == [1, 3, 5, 7, 9]


def test_same_shard_options_in_both_places_are_accepted():
    opts = dl.ShardOptions(1, 2)
    loader = dl.DataLoader(dl.RangeDataSource(10), dl.IndexSampler(10, shard_options=opts, num_epochs=1), shard_options=dl.ShardOptions(1, 2))
    assert list(loader) == [1, 3, 5, 7, 9]


def test_restore_is_constant_time_far_into_an_infinite_stream():
    source = CountingSource(1000)
    loader = dl.DataLoader(source, dl.IndexSampler(1000, shuffle=True, seed=1), [dl.Batch(10)])
    it = iter(loader)
    next(it)
    state = it.get_state()
    state["position"] = 10 * 10**9
    it2 = iter(loader)
    it2.set_state(state)
    before = source.reads
    batch = next(it2)
    assert source.reads - before == 10
    keys = loader.sampler.record_keys(np.arange(10 * 10**9, 10 * 10**9 + 10)).tolist()
    assert batch.tolist() == keys


def test_state_is_small_json_and_accepted_as_json_text():
    import json

    it = iter(make_loader("everything"))
    next(it)
    state = it.get_state()
    text = json.dumps(state)
    assert len(text) < 1000
    it2 = iter(make_loader("everything"))
    it2.set_state(text.encode())
    assert_streams_equal([next(it2)], [next(it)])


def test_operation_error_names_the_operation_and_record_and_chains_the_cause():
    def explode(x):
        if x == 13:
            raise KeyError("bad record")
        return x

    loader = dl.DataLoader(dl.RangeDataSource(20), dl.SequentialSampler(20), [dl.MapTransform(explode), dl.Batch(4)])
    it = iter(loader)
    got = [next(it).tolist() for _ in range(3)]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    with pytest.raises(dl.PipelineError, match=r"MapTransform\(.*explode\) failed on record 13 .*KeyError") as info:
        next(it)
    assert isinstance(info.value.__cause__, KeyError)
    assert info.value.record_index == 13


def test_unbatchable_shapes_name_the_field_and_shapes():
    loader = dl.DataLoader(
        dl.RangeDataSource(4), dl.SequentialSampler(4),
        [dl.MapTransform(lambda x: {"img": np.zeros(x + 1)}), dl.Batch(2)],
    )
    with pytest.raises(dl.PipelineError, match=r"field \['img'\]: element 0 has shape \(1,\) but element 1 has \(2,\)"):
        next(iter(loader))


def test_max_fan_out_overflow_is_an_error():
    loader = dl.DataLoader(
        dl.RangeDataSource(4), dl.SequentialSampler(4), [dl.FlatMapTransform(lambda x: [x] * 3, max_fan_out=2)]
    )
    with pytest.raises(dl.PipelineError, match=r"produced 3 elements from one input, more than max_fan_out=2"):
        next(iter(loader))


def test_failed_read_names_the_records_and_source():
    class Broken(CountingSource):
        def __getitems__(self, indices):
            raise OSError("disk gone")

    loader = dl.DataLoader(Broken(8), dl.SequentialSampler(8), [dl.Batch(4)])
    with pytest.raises(dl.PipelineError, match=r"reading records \[0, 1, 2, 3\] from .* failed: OSError: disk gone"):
        next(iter(loader))


def test_a_corrupt_record_is_named_exactly_with_its_file_and_the_readers_message(tmp_path):
    # Two real ArrayRecord files; record 7 of the second (global record 27) is corrupt.
    source = dl.ArrayRecordDataSource(two_array_record_files(tmp_path, corrupt=7))
    loader = dl.DataLoader(source, dl.SequentialSampler(40), [dl.Batch(8)])
    it = iter(loader)
    assert [len(next(it)) for _ in range(3)] == [8, 8, 8]  # records 0-23 read fine
    with pytest.raises(
        dl.PipelineError,
        match=r"reading record 27 \(position 27\) in file '.*b\.array_record' \(record 7 of its 20\) "
        r"from ArrayRecordDataSource.* failed: RuntimeError: .*chunk data hash mismatch",
    ) as info:
        next(it)
    assert info.value.record_index == 27 and info.value.position == 27
    assert info.value.operation == "read"
    assert "hash mismatch" in str(info.value.__cause__)


def test_every_unreadable_record_of_the_unit_is_listed():
    class Holes(CountingSource):
        def __getitem__(self, i):
            if i in (5, 6):
                raise OSError(f"sector of record {i} unreadable")
            return int(i)

        def __getitems__(self, indices):
            return [self[i] for i in indices]

    loader = dl.DataLoader(Holes(8), dl.SequentialSampler(8), [dl.Batch(4)])
    it = iter(loader)
    next(it)
    with pytest.raises(dl.PipelineError, match=r"reading record 5 \(position 5\) from .* failed: OSError: sector of record 5 unreadable; records \[6\] of the same unit fail too"):
        next(it)


@pytest.mark.parametrize("raised", [SystemExit(3), SystemExit, GeneratorExit, type("Custom", (BaseException,), {})])
def test_base_exceptions_of_user_code_are_pipeline_errors_in_process(raised):
    def explode(x):
        if x == 6:
            raise raised
        return x

    loader = dl.DataLoader(dl.RangeDataSource(12), dl.SequentialSampler(12), [dl.MapTransform(explode), dl.Batch(4)])
    it = iter(loader)
    next(it)
    with pytest.raises(dl.PipelineError, match=r"MapTransform\(.*explode\) failed on record 6 \(position 6\)") as info:
        next(it)
    assert info.value.record_index == 6
    assert isinstance(info.value.__cause__, raised if isinstance(raised, type) else type(raised))


def test_keyboard_interrupt_passes_through_in_process():
    """In the training process a KeyboardInterrupt may be a real Ctrl-C: it is not wrapped."""

    def interrupted(x):
        raise KeyboardInterrupt

    loader = dl.DataLoader(dl.RangeDataSource(4), dl.SequentialSampler(4), [dl.MapTransform(interrupted)])
    with pytest.raises(KeyboardInterrupt):
        next(iter(loader))


# --- bad input, refused at construction ---------------------------------------------------


def test_sampler_larger_than_the_source_is_refused():
    with pytest.raises(ValueError, match=r"num_records=20 but the data source .* holds only 10 records"):
        dl.DataLoader(dl.RangeDataSource(10), dl.IndexSampler(20))


def test_a_plain_function_as_operation_is_refused_with_a_hint():
    def decode(x):
        return x

    with pytest.raises(TypeError, match=r"operations\[0\] is .*expected a MapTransform.*wrap it as MapTransform\(decode\)"):
        dl.DataLoader(dl.RangeDataSource(10), dl.IndexSampler(10), [decode])


def test_two_batches_are_refused():
    with pytest.raises(ValueError, match=r"operations\[1\] is a second Batch"):
        dl.DataLoader(dl.RangeDataSource(10), dl.IndexSampler(10), [dl.Batch(2), dl.Batch(2)])


def test_random_map_without_a_seed_is_refused():
    with pytest.raises(ValueError, match=r"random map but the sampler has no seed; pass seed="):
        dl.DataLoader(dl.RangeDataSource(10), dl.IndexSampler(10), [dl.RandomMapTransform(lambda x, r: x)])


def test_conflicting_shard_options_are_refused():
    sampler = dl.IndexSampler(10, shard_options=dl.ShardOptions(0, 2))
    with pytest.raises(ValueError, match=r"already sharded .* pass the shard options in one place only"):
        dl.DataLoader(dl.RangeDataSource(10), sampler, shard_options=dl.ShardOptions(1, 2))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"worker_count": -1}, r'worker_count must be an integer >= 0 or "auto", got -1; .*pass worker_count="auto"'),
    ({"worker_buffer_size": 0}, r"worker_buffer_size must be an integer >= 1, got 0"),
    ({"read_options": "fast"}, r"read_options must be a ReadOptions, got 'fast'"),
    ({"worker_init_fn": 3}, r"worker_init_fn must be callable, got 3"),
    ({"warm_start": "no"}, r"warm_start must be True or False, got 'no' of type str"),
    ({"stall_warning_s": 0}, r"stall_warning_s must be a positive number of seconds or None, got 0"),
    ({"stall_warning_s": "60"}, r"stall_warning_s must be a positive number of seconds or None, got '60'"),
    ({"unit_timeout_s": True, "worker_count": 1}, r"unit_timeout_s must be a positive number of seconds or None, got True"),
    ({"unit_timeout_s": float("inf"), "worker_count": 1}, r"unit_timeout_s must be a positive number of seconds or None, got inf"),
    ({"unit_timeout_s": 5}, r"unit_timeout_s=5 needs worker_count > 0: a unit computed in this process cannot be stopped"),
])
def test_bad_loader_options_are_refused(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        dl.DataLoader(dl.RangeDataSource(10), dl.IndexSampler(10), **kwargs)


@pytest.mark.parametrize("operations", [dl.MapTransform(abs), None, dl.Batch(4), (op for op in [dl.Batch(4)]), "Batch"])
def test_operations_that_are_not_a_list_are_refused_naming_operations(operations):
    with pytest.raises(TypeError, match=r"operations must be a list of operations, got .* of type \w+; pass a list, e.g. operations=\["):
        dl.DataLoader(dl.RangeDataSource(10), dl.IndexSampler(10), operations)


class _Halve(dl.MapTransform):
    def map(self, element):
        return element // 2


@pytest.mark.parametrize(("operation", "call"), [
    (dl.Batch, r"Batch\(batch_size=\.\.\.\)"),
    (dl.MapTransform, r"MapTransform\(your_function\)"),
    (_Halve, r"_Halve\(\)"),
    (dl.BucketByLength, r"BucketByLength\(element_length_func=\.\.\., bucket_boundaries=\.\.\., bucket_batch_sizes=\.\.\.\)"),
    (dl.FirstFitPack, r"FirstFitPack\(length_struct=\.\.\., num_packing_bins=\.\.\.\)"),
])
def test_an_operation_class_is_refused_at_construction_with_the_call_that_makes_one(operation, call):
    """operations=[dl.Batch] (the class) used to fail at the first batch with
    "type object 'Batch' has no attribute 'batch_size'"."""
    with pytest.raises(TypeError, match=rf"operations\[1\] is the class {operation.__name__}, not an operation; pass an instance, {call}$"):
        dl.DataLoader(dl.RangeDataSource(10), dl.IndexSampler(10), [dl.MapTransform(abs), operation])


def test_operations_may_be_a_list_or_a_tuple():
    for operations in ([dl.Batch(5)], (dl.Batch(5),), [], ()):
        assert len(list(dl.DataLoader(dl.RangeDataSource(10), dl.SequentialSampler(10), operations))) in (2, 10)


def test_a_source_without_getitem_is_refused():
    with pytest.raises(TypeError, match=r"needs __len__ and __getitem__"):
        dl.DataLoader(object(), dl.IndexSampler(10))


def test_something_that_is_not_a_sampler_is_refused():
    with pytest.raises(TypeError, match=r"is not a Sampler: it has no .*'record_keys'.*; pass a dl.IndexSampler"):
        dl.DataLoader(dl.RangeDataSource(10), [1, 2, 3])


def test_stats_say_where_the_time_went():
    import time as _time

    def slow(x):
        _time.sleep(0.001)
        return x

    loader = dl.DataLoader(dl.RangeDataSource(40), dl.SequentialSampler(40), [dl.MapTransform(slow), dl.Batch(8)])
    it = iter(loader)
    list(it)
    stats = it.stats()
    assert stats["units"] == 5 and stats["records_read"] == 40
    stages = stats["stage_seconds"]
    assert set(stages) == {"read", "MapTransform(test_stats_say_where_the_time_went.<locals>.slow)", "batch"}
    assert stages["MapTransform(test_stats_say_where_the_time_went.<locals>.slow)"] >= 0.04
    assert stats["first_next_s"] + stats["wait_s"] >= 0.04  # the first next() is start-up


def test_load_is_grains_one_call_loader():
    """``dl.load`` (Grain's ``grain.load``) builds the sampler, appends the batch and
    gives the same batches as the DataLoader written out."""
    source = dl.RangeDataSource(0, 23, 1)
    square = dl.transforms.Map(lambda x: x * x)
    loaded = dl.load(source, num_epochs=2, shuffle=True, seed=5, shard_options=dl.ShardOptions(1, 2),
                     transformations=[square], batch_size=4, drop_remainder=True)
    written = dl.DataLoader(
        source,
        dl.IndexSampler(23, shard_options=dl.ShardOptions(1, 2), shuffle=True, num_epochs=2, seed=5),
        [square, dl.Batch(4, drop_remainder=True)],
    )
    assert_streams_equal(list(loaded), list(written))
    assert [len(b) for b in loaded] == [4] * 5
    assert [b.tolist() for b in dl.load(source, num_epochs=1, batch_size=10, worker_count=None)] == [
        list(range(10)), list(range(10, 20)), [20, 21, 22]]
