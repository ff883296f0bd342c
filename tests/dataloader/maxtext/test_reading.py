"""Where the records come from: TFRecord file streams (sharded, interleaved, window-shuffled),
the read-ahead of the indexed sources, and MaxText's file sharding."""

from __future__ import annotations

import numpy as np
import pytest

import dataloader as dl
from dataloader.maxtext import eval_dataset, parse_maxtext_config, tokenizer, train_dataset
from dataloader.maxtext.reading import file_sharding
from tests.dataloader.maxtext.test_pipeline import _take
from tests.helpers import assert_restores_everywhere


def _rows(batches):
    """The real token lists of one-sequence-per-row batches (packing: false), in order."""
    out = []
    for b in batches:
        mask = b["mask"] if "mask" in b else np.ones(len(b["inputs"]), bool)
        for tokens, segments, real in zip(b["inputs"], b["inputs_segmentation"], mask):
            if real:
                out.append(tokens[segments > 0].tolist())
    return out


def _tfrecord_keys(base_keys, text_data, **more):
    folder = text_data["folder"]
    return {**base_keys, "grain_file_type": "tfrecord", "grain_train_files": str(folder / "train-*.tfrecord"),
            "grain_eval_files": str(folder / "eval.tfrecord"), **more}


def _tokens(config, lines):
    tok = tokenizer(config)
    return [tok.map(line)["tokens"].tolist() for line in lines]


@pytest.mark.parametrize(("files", "hosts", "expected"), [
    (8, 2, [(slice(0, None, 2), 4, None), (slice(1, None, 2), 4, None)]),
    (3, 2, [(slice(0, None, 2), 1, None), (slice(1, None, 2), 1, None)]),
    (1, 3, [(slice(0, None, 1), 1, (h, 3)) for h in range(3)]),
    (2, 3, [(slice(0, None, 2), 1, (0, 2)), (slice(1, None, 2), 1, None), (slice(0, None, 2), 1, (1, 2))]),
])
def test_files_are_shared_out_over_hosts_as_maxtext_does(files, hosts, expected):
    assert [file_sharding(files, h, hosts) for h in range(hosts)] == expected


@pytest.mark.parametrize("packing", [True, False])
def test_tfrecord_examples_give_the_batches_of_the_same_texts_in_arrayrecord(base_keys, text_data, packing):
    ours = parse_maxtext_config(_tfrecord_keys(base_keys, text_data, packing=packing))
    theirs = parse_maxtext_config({**base_keys, "packing": packing})
    got = _take(eval_dataset(ours, global_batch_size=4), None)
    expected = _take(eval_dataset(theirs, global_batch_size=4), None)
    assert len(got) == len(expected) > 1
    for a, b in zip(got, expected):
        assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


def test_each_host_reads_its_own_tfrecord_files(base_keys, text_data):
    config = parse_maxtext_config(_tfrecord_keys(base_keys, text_data, packing=False,
                                                 grain_eval_files=str(text_data["folder"] / "train-*.tfrecord")))
    train = text_data["train_lines"]
    for host in range(2):  # two files, two hosts: a file each, in file order (eval: no shuffle)
        rows = _rows(_take(eval_dataset(config, global_batch_size=4, shard_options=dl.ShardOptions(host, 2)), None))
        assert rows == _tokens(config, train[host::2])


def test_hosts_share_one_tfrecord_file_record_by_record(base_keys, text_data):
    config = parse_maxtext_config(_tfrecord_keys(base_keys, text_data, packing=False))
    expected = _tokens(config, text_data["held_out"])
    for host in range(3):
        rows = _rows(_take(eval_dataset(config, global_batch_size=3, shard_options=dl.ShardOptions(host, 3)), None))
        assert rows == expected[host::3]


def test_tfrecord_training_shuffles_files_and_records_within_the_window(base_keys, text_data):
    keys = _tfrecord_keys(base_keys, text_data, packing=False, num_epoch=1, grain_num_threads=1)
    config = parse_maxtext_config({**keys, "grain_shuffle_buffer_size": 1})
    in_order = _rows(_take(train_dataset(config, global_batch_size=4), None))
    train = text_data["train_lines"]
    files = [_tokens(config, train[0::2]), _tokens(config, train[1::2])]
    assert in_order in (files[0] + files[1], files[1] + files[0])  # one file at a time, whole
    shuffled = _rows(_take(train_dataset(parse_maxtext_config({**keys, "grain_shuffle_buffer_size": 8}),
                                         global_batch_size=4), None))
    assert shuffled != in_order
    for w in range(0, 56, 8):  # every window of 8 holds the same records, in another order
        assert sorted(shuffled[w:w + 8]) == sorted(in_order[w:w + 8])


def test_tfrecord_files_interleave_up_to_grain_num_threads(base_keys, text_data):
    config = parse_maxtext_config(_tfrecord_keys(base_keys, text_data, packing=False, enable_data_shuffling=False))
    rows = _rows(_take(train_dataset(config, global_batch_size=4), 4))
    train = text_data["train_lines"]
    alternate = [t for pair in zip(train[0::2], train[1::2]) for t in pair]
    assert rows == _tokens(config, alternate[:16])


def test_a_mixture_of_tfrecord_patterns_points_to_the_mixture_file(base_keys, text_data):
    folder = text_data["folder"]
    config = parse_maxtext_config(_tfrecord_keys(
        base_keys, text_data, grain_train_files=f"{folder}/train-0.tfrecord,1;{folder}/train-1.tfrecord,1"))
    with pytest.raises(ValueError, match=r"works with grain_file_type: arrayrecord only, as in MaxText; for "
                                         r"tfrecord name the components in a grain_train_mixture_config_path"):
        train_dataset(config, global_batch_size=4)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tfrecord_training_restores_at_every_step(base_keys, text_data):
    config = parse_maxtext_config(_tfrecord_keys(base_keys, text_data, num_epoch=2, grain_shuffle_buffer_size=16))
    outputs = assert_restores_everywhere(lambda: iter(train_dataset(config, global_batch_size=2)), limit=30)
    assert len(outputs) == 30


def test_read_ahead_threads_do_not_change_the_batches(base_keys):
    from dataloader.maxtext.pipeline import read_options

    config = parse_maxtext_config({**base_keys, "grain_num_threads": 3, "grain_prefetch_buffer_size": 300})
    # Records, as MaxText's base.yml and Grain count them.
    assert read_options(config) == dl.ReadOptions(num_threads=3, prefetch_buffer_size=300)
    assert read_options(config, eval=True) == dl.ReadOptions(num_threads=16, prefetch_buffer_size=500)
    plain = parse_maxtext_config({**base_keys, "grain_num_threads": 0})
    got = _take(train_dataset(config, global_batch_size=4), 6)
    expected = _take(train_dataset(plain, global_batch_size=4), 6)
    assert all(np.array_equal(a[k], b[k]) for a, b in zip(got, expected) for k in a) and len(got) == 6


@pytest.mark.parametrize("option", ["in_memory", "offloaded"])
def test_the_index_storage_option_reaches_the_arrayrecord_reader(base_keys, text_data, option):
    from dataloader.maxtext.reading import open_sources

    config = parse_maxtext_config({**base_keys, "grain_index_storage_option": option})
    (source,) = open_sources(config, [text_data["train"]])
    assert source.reader_options["index_storage_option"] == option
    plain = parse_maxtext_config(base_keys)
    got = _take(train_dataset(config, global_batch_size=4), 3)
    expected = _take(train_dataset(plain, global_batch_size=4), 3)
    assert all(np.array_equal(a[k], b[k]) for a, b in zip(got, expected) for k in a) and len(got) == 3


def test_a_mixtures_sources_open_in_grain_data_source_max_workers_threads(base_keys, text_data, monkeypatch):
    from concurrent import futures

    from dataloader.maxtext import reading

    pools = []

    class Recorded(futures.ThreadPoolExecutor):
        def __init__(self, max_workers):
            pools.append(max_workers)
            super().__init__(max_workers=max_workers)

    monkeypatch.setattr(reading.futures, "ThreadPoolExecutor", Recorded)
    folder = text_data["folder"]
    config = parse_maxtext_config({**base_keys, "grain_data_source_max_workers": 2})
    sources = reading.open_sources(config, [f"{folder}/train-0.array_record", f"{folder}/train-1.array_record",
                                            f"{folder}/eval.array_record"])
    assert [len(s) for s in sources] == [60, 60, 40] and pools == [2]


def test_tfrecord_with_workers_says_where_it_is_read(base_keys, text_data, caplog):
    caplog.set_level("INFO", logger="absl")  # absl.app, run by other tests, may have raised its level
    config = parse_maxtext_config(_tfrecord_keys(base_keys, text_data, grain_worker_count_eval=2))
    batches = _take(eval_dataset(config, global_batch_size=4), 2)
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("granary: grain_worker")]
    assert len(logged) == 1
    assert "grain_worker_count_eval=2 with grain_file_type tfrecord: the files are read and tokenized in " \
           "this process" in logged[0]
    assert len(batches) == 2
