"""MaxText's pipeline end to end: tokenize, pack, batch, layout; restores and worker counts."""

from __future__ import annotations

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
