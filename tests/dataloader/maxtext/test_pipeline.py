"""MaxText's pipeline end to end: tokenize, pack, batch, layout; restores and worker counts."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dataloader as dl
from dataloader.maxtext import KEYS, eval_dataset, parse_maxtext_config, train_dataset
from tests.helpers import assert_restores_everywhere, assert_streams_equal, take


def _take(ds, n):
    """The first ``n`` outputs of a fresh iterator of ``ds``, which is then closed."""
    it = iter(ds)
    try:
        return take(it, n)
    finally:
        it.close()


def _all(ds):
    return _take(ds, None)


def _tokens_of(lines, text_data, **options):
    op = dl.Tokenize(text_data["huggingface"], **options)
    return [op.map(line)["tokens"].tolist() for line in lines]


def _segments(batch):
    """The token lists of a batch's segments, row by row (what the packer put where)."""
    out = []
    for tokens, segments in zip(batch["inputs"], batch["inputs_segmentation"]):
        for s in range(1, int(segments.max()) + 1):
            out.append(tokens[segments == s].tolist())
    return out


@pytest.mark.parametrize("packing_type", ["first_fit", "best_fit", "concat_then_split"])
def test_batches_have_maxtexts_keys_and_shift(base_keys, packing_type):
    config = parse_maxtext_config({**base_keys, "grain_packing_type": packing_type})
    batch = _take(train_dataset(config, global_batch_size=4), 1)[0]
    assert sorted(batch) == sorted(KEYS)
    assert all(v.shape == (4, 24) and v.dtype == np.int32 for v in batch.values())
    assert np.array_equal(batch["targets"][:, :-1], batch["inputs"][:, 1:])
    same = (batch["inputs_segmentation"][:, 1:] == batch["inputs_segmentation"][:, :-1]) & (batch["inputs_segmentation"][:, 1:] > 0)
    assert np.array_equal(batch["targets_segmentation"][:, :-1] > 0, same)
    assert (batch["targets_segmentation"][:, -1] == 0).all()


def test_first_fit_rows_hold_whole_tokenized_lines_with_bos_and_eos(base_keys, text_data):
    config = parse_maxtext_config({**base_keys, "enable_data_shuffling": False, "max_target_length": 64})
    segments = [s for batch in _take(train_dataset(config, global_batch_size=4), 3) for s in _segments(batch)]
    known = {tuple(t) for t in _tokens_of(_all_train_lines(text_data), text_data, add_bos=True, add_eos=True)}
    assert segments and all(tuple(s) in known for s in segments)
    assert all(s[0] == 1 and s[-1] == 2 for s in segments)  # <s> ... </s>


def _all_train_lines(text_data):
    from tests import tokenizer_files as tf

    return tf.corpus(160)[:120]


def test_concat_then_split_loses_no_token(base_keys, text_data):
    config = parse_maxtext_config({**base_keys, "grain_packing_type": "concat_then_split",
                                   "enable_data_shuffling": False, "add_bos": False})
    batches = _all(train_dataset(config, global_batch_size=2))
    stream = np.concatenate([b["inputs"][b["inputs_segmentation"] > 0] for b in batches]).tolist()
    source = dl.ArrayRecordDataSource(text_data["train"])
    expected = [t for i in range(len(source)) for t in _tokens_of([source[i]], text_data, add_eos=True)[0]]
    assert stream == expected[: len(stream)] and len(expected) - len(stream) < 2 * 24


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_zero_one_and_two_workers_give_the_same_batches(base_keys):
    streams = [_take(train_dataset(parse_maxtext_config({**base_keys, "grain_worker_count": w}),
                                   global_batch_size=4), 12) for w in (0, 1, 2)]
    assert len(streams[0]) == 12
    assert_streams_equal(streams[0], streams[1])
    assert_streams_equal(streams[0], streams[2])


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("packing_type", ["first_fit", "concat_then_split"])
def test_restores_at_every_step(base_keys, packing_type):
    config = parse_maxtext_config({**base_keys, "grain_packing_type": packing_type, "num_epoch": 2})
    outputs = assert_restores_everywhere(lambda: iter(train_dataset(config, global_batch_size=2)), limit=40)
    assert len(outputs) == 40


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_restores_with_workers_into_another_worker_count(base_keys):
    config = parse_maxtext_config({**base_keys, "grain_worker_count": 2})
    it = iter(train_dataset(config, global_batch_size=4))
    take(it, 5)
    state = it.get_state()
    expected = take(it, 5)
    it.close()
    other = iter(train_dataset(parse_maxtext_config({**base_keys, "grain_worker_count": 0}), global_batch_size=4))
    other.set_state(state)
    rest = take(other, 5)
    other.close()
    assert_streams_equal(rest, expected)


@pytest.mark.parametrize("packing", [True, False])
def test_eval_keeps_every_sequence_once_and_pads_the_last_batch(base_keys, text_data, packing):
    config = parse_maxtext_config({**base_keys, "packing": packing})
    batches = _all(eval_dataset(config, global_batch_size=3))
    assert all(b["inputs"].shape == (3, 24) and b["mask"].shape == (3,) for b in batches)
    assert all(b["mask"].all() for b in batches[:-1]) and batches[-1]["mask"][0]
    if not packing:  # one row per line: 40 lines are 13 full batches and one of 1 row
        assert len(batches) == 14 and batches[-1]["mask"].tolist() == [True, False, False]
    real = [s for b in batches for s in _segments({k: v[b["mask"]] for k, v in b.items()})]
    expected = _tokens_of(text_data["held_out"], text_data, add_bos=True, add_eos=True)
    assert sorted(real) == sorted(expected)
    padded = batches[-1]
    assert (padded["targets_segmentation"][~padded["mask"]] == 0).all()


def test_eval_reads_json_records_and_parquet_rows(base_keys, text_data):
    expected = sorted(_tokens_of(text_data["held_out"], text_data, add_bos=True, add_eos=True))
    for keys in ({"grain_eval_files": str(text_data["folder"] / "json.array_record"), "record_format": "json",
                  "eval_data_columns": ["body"]},
                 {"grain_eval_files": str(text_data["folder"] / "eval.parquet"), "grain_file_type": "parquet",
                  "grain_train_files": str(text_data["folder"] / "eval.parquet")}):
        batches = _all(eval_dataset(parse_maxtext_config({**base_keys, **keys}), global_batch_size=4))
        real = [s for b in batches for s in _segments({k: v[b["mask"]] for k, v in b.items()})]
        assert sorted(real) == expected


def test_a_mixture_draws_from_both_patterns(base_keys, text_data):
    folder = text_data["folder"]
    spec = f"{folder}/train-0.array_record,0.25;{folder}/train-1.array_record,0.75"
    config = parse_maxtext_config({**base_keys, "grain_train_files": spec, "packing": False, "num_epoch": None})
    batches = _take(train_dataset(config, global_batch_size=4), 10)
    source0 = {tuple(t) for t in _tokens_of([r for r in dl.ArrayRecordDataSource(f"{folder}/train-0.array_record")],
                                            text_data, add_bos=True, add_eos=True)}
    rows = [tuple(s) for b in batches for s in _segments(b)]
    assert sum(r in source0 for r in rows) == 10  # exactly a quarter of 40 rows


def _mixture_file(tmp_path, components, name="mix.json"):
    path = tmp_path / name
    path.write_text(json.dumps({k: {"path": p, "weight": w} for k, (p, w) in components.items()}))
    return str(path)


def _unpacked_rows(batches):
    return [tuple(s) for b in batches for s in _segments(b)]


@pytest.fixture
def named(base_keys, text_data, tmp_path):
    """A named mixture's keys (rows unpacked, records in file order, endless) and each
    component's rows in order."""
    folder = text_data["folder"]
    files = {"a": f"{folder}/train-0.array_record", "b": f"{folder}/train-1.array_record",
             "c": f"{folder}/eval.array_record"}
    keys = {**base_keys, "packing": False, "enable_data_shuffling": False, "num_epoch": None}
    config = parse_maxtext_config(keys)
    op = dl.maxtext.tokenizer(config)
    rows = {k: [tuple(op.map(r)["tokens"].tolist()) for r in dl.ArrayRecordDataSource(p)] for k, p in files.items()}

    def keys_for(weights, name="mix.json"):
        path = _mixture_file(tmp_path, {k: (files[k], w) for k, w in weights.items()}, name)
        return {**keys, "grain_train_mixture_config_path": path}

    return keys_for, rows


def test_a_named_mixture_draws_by_weight_from_its_components(named):
    keys_for, rows = named
    config = parse_maxtext_config(keys_for({"a": 1, "b": 3}))
    drawn = _unpacked_rows(_take(train_dataset(config, global_batch_size=4), 10))
    from_a = [r for r in drawn if r in rows["a"]]
    assert len(from_a) == 10 and from_a == rows["a"][:10]  # a quarter of 40, in a's order
    assert [r for r in drawn if r not in rows["a"]] == rows["b"][:30]


def test_a_named_mixture_restores_by_name_with_other_weights_and_components(named):
    keys_for, rows = named
    it = iter(train_dataset(parse_maxtext_config(keys_for({"a": 1, "b": 3})), global_batch_size=4))
    take(it, 3)  # 12 rows: 3 of a, 9 of b
    state = it.get_state()
    it.close()
    reweighted = iter(train_dataset(parse_maxtext_config(keys_for({"a": 1, "b": 1}, "two.json")), global_batch_size=4))
    reweighted.set_state(state)
    after = _unpacked_rows(take(reweighted, 2))
    reweighted.close()
    assert [r for r in after if r in rows["a"]] == rows["a"][3:7]  # each continues where it was
    assert [r for r in after if r in rows["b"]] == rows["b"][9:13]
    changed = iter(train_dataset(parse_maxtext_config(keys_for({"a": 1, "c": 1}, "three.json")), global_batch_size=4))
    changed.set_state(state)  # b is dropped, c is new
    after = _unpacked_rows(take(changed, 2))
    changed.close()
    assert [r for r in after if r in rows["a"]] == rows["a"][3:7]
    assert [r for r in after if r in rows["c"]] == rows["c"][:4]


def test_a_named_mixture_follows_a_weight_schedule_and_restores_across_the_switch(named):
    """The mixture file's weights as [at, weight] points: b is off for the first 8
    documents, then a and b alternate; a restore at every step around the switch
    continues exactly."""
    keys_for, rows = named
    config = parse_maxtext_config(keys_for({"a": [[0, 1], [8, 1]], "b": [[0, 0], [8, 1]]}))

    def dataset():
        return train_dataset(config, global_batch_size=2)

    drawn = _unpacked_rows(_take(dataset(), 8))
    assert drawn[:8] == rows["a"][:8]
    assert drawn[8:] == [r for pair in zip(rows["a"][8:12], rows["b"][:4]) for r in pair]
    for k in range(2, 7):  # saved after 4 to 12 documents: the switch is after 8
        it = iter(dataset())
        take(it, k)
        state = it.get_state()
        it.close()
        restored = iter(dataset())
        restored.set_state(state)
        assert _unpacked_rows(take(restored, 8 - k)) == drawn[2 * k:]
        restored.close()


def test_a_named_mixture_of_tfrecord_files(named, text_data):
    keys_for, rows = named
    folder = text_data["folder"]
    keys = keys_for({"a": 1, "b": 1})
    path = _mixture_file(text_data["folder"].parent, {"a": (f"{folder}/train-0.tfrecord", 1),
                                                       "b": (f"{folder}/train-1.tfrecord", 1)}, "tf.json")
    config = parse_maxtext_config({**keys, "grain_file_type": "tfrecord", "grain_train_mixture_config_path": path})
    drawn = _unpacked_rows(_take(train_dataset(config, global_batch_size=4), 4))
    assert [r for r in drawn if r in rows["a"]] == rows["a"][:8]
    assert [r for r in drawn if r in rows["b"]] == rows["b"][:8]


def test_the_ram_budget_bounds_the_auto_workers():
    from dataloader.maxtext.pipeline import auto_workers

    gib = 1 << 30
    assert auto_workers(1024, {"MemTotal": 16 * gib, "MemAvailable": 9 * gib}).min_free_memory == 0.5
    assert auto_workers(64 * 1024, {"MemTotal": 16 * gib, "MemAvailable": 9 * gib}).min_free_memory == 0.0
    assert auto_workers(1024, {}) == dl.AutoWorkers()


def test_the_memory_auto_workers_budgets_is_the_containers(monkeypatch):
    from dataloader.engine.pool.autoscale import limits
    from dataloader.maxtext import pipeline

    gib = 1 << 30
    # a 2 GiB container using 0.5 GiB on a host with 60 GiB free of 64
    found = limits.Limits(host_total=64 * gib, host_available=60 * gib, memory_room=3 * gib // 2,
                          memory=limits.Limit(2 * gib, "memory.max"))
    monkeypatch.setattr(limits, "read_limits", lambda: found)
    assert pipeline._meminfo() == {"MemTotal": 2 * gib, "MemAvailable": 3 * gib // 2}
    # 1 GiB of budget: keep 0.5 GiB of the container's 2 GiB free (not 59 GiB of the host's 64)
    assert pipeline.auto_workers(1024).min_free_memory == 0.25


def test_elastic_batches_restore_on_another_host_count(base_keys):
    config = parse_maxtext_config({**base_keys, "grain_use_elastic_iterator": True, "packing": False})
    # One JAX process here: global_batch_size is what each host loads, 2 rows on each of 2 hosts.
    hosts = [iter(train_dataset(config, global_batch_size=2, shard_options=dl.ShardOptions(h, 2))) for h in range(2)]
    for it in hosts:
        take(it, 3)
    state = hosts[0].get_state()
    assert state["global_next_index"] == 12
    two = [take(it, 2) for it in hosts]
    for it in hosts:
        it.close()
    one = iter(train_dataset(config, global_batch_size=4, shard_options=dl.ShardOptions(0, 1)))
    one.set_state(state)
    alone = take(one, 2)
    one.close()
    for step in range(2):
        assert alone[step]["inputs"].shape == (4, 24)
        assert sorted(KEYS) == sorted(alone[step])
        together = np.concatenate([two[0][step]["inputs"], two[1][step]["inputs"]])
        assert sorted(map(tuple, alone[step]["inputs"].tolist())) == sorted(map(tuple, together.tolist()))
    assert np.array_equal(alone[0]["targets"][:, :-1], alone[0]["inputs"][:, 1:])
