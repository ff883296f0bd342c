"""Packing on the stream: Grain's datasets and the DataLoader's packers restore exactly at
every step, do not depend on the worker count, and refuse a state of another packer."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest

import dataloader as dl
from tests.helpers import assert_restores_everywhere, assert_streams_equal

LENGTHS = np.random.default_rng(0).integers(1, 40, size=300)


def tokens(i):
    """Record ``i`` tokenised: a sequence of a stored length, its tokens saying where from."""
    n = int(LENGTHS[int(i) % len(LENGTHS)])
    return {"tokens": np.arange(n, dtype=np.int32) + 1000 * int(i) + 1}


def loader_stream(workers=0, shuffle=True):
    return (dl.MapDataset.range(len(LENGTHS)).seed(5).shuffle() if shuffle else
            dl.MapDataset.range(len(LENGTHS))).map(tokens).to_iter_dataset().mp_prefetch(
                dl.MultiprocessingOptions(num_workers=workers))


PACKERS = {
    "first_fit": lambda ds: dl.experimental.FirstFitPackIterDataset(
        ds, length_struct={"tokens": 64}, num_packing_bins=4, seed=2),
    "best_fit": lambda ds: dl.experimental.BestFitPackIterDataset(
        ds, length_struct={"tokens": 64}, num_packing_bins=4, shuffle_bins=False),
    "concat_then_split": lambda ds: dl.experimental.ConcatThenSplitIterDataset(
        ds, length_struct={"tokens": 64}),
    "concat_then_split_bos": lambda ds: dl.experimental.ConcatThenSplitIterDataset(
        ds, length_struct={"tokens": 64}, bos_handling=dl.experimental.BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS,
        bos_features=["tokens"], bos_token_id=0),
}


@pytest.mark.parametrize("name", PACKERS)
def test_packed_rows_restore_at_every_step(name):
    ds = PACKERS[name](loader_stream()).batch(2)
    assert_restores_everywhere(lambda: iter(ds), limit=25, fresh_iterator_every=3)


@pytest.mark.parametrize("name", ["first_fit", "concat_then_split"])
def test_packing_after_a_filter_and_flat_map_restores_at_every_step(name):
    base = (dl.MapDataset.range(120).seed(1).shuffle().map(tokens).to_iter_dataset()
            .filter(lambda x: len(x["tokens"]) % 4 != 0)
            .flat_map(lambda x: [x, {"tokens": x["tokens"][:3]}]))
    assert_restores_everywhere(lambda: iter(PACKERS[name](base)), limit=30)


def test_every_token_of_the_stream_is_in_the_concat_then_split_rows_in_order():
    stream = np.concatenate([x["tokens"] for x in loader_stream(shuffle=False)])
    rows = list(PACKERS["concat_then_split"](loader_stream(shuffle=False)))
    packed = np.concatenate([r["tokens"][r["tokens_segment_ids"] > 0] for r in rows])
    assert packed.tolist() == stream.tolist()


def test_a_packing_state_is_small_and_does_not_grow_with_the_stream():
    it = iter(PACKERS["first_fit"](loader_stream()))
    sizes = []
    for step in range(60):
        next(it)
        if step in (0, 59):
            state = it.get_state()
            # The engine's fingerprint (its last step's records) is one step's, of fixed
            # size, and absent while the packer's restart point is the stream's start.
            state["parent"].pop("fingerprint", None)
            sizes.append(len(json.dumps(state)))
    assert max(sizes) < 1500 and sizes[1] <= sizes[0] + 20


def test_a_state_of_another_packer_is_refused():
    it = iter(PACKERS["first_fit"](loader_stream()))
    next(it)
    state = it.get_state()
    other = iter(dl.experimental.FirstFitPackIterDataset(
        loader_stream(), length_struct={"tokens": 64}, num_packing_bins=8, seed=2))
    with pytest.raises(dl.StateMismatchError, match=r"saved for the packer .*'num_packing_bins': 4.* packs with .*'num_packing_bins': 8"):
        other.set_state(state)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", ["first_fit", "concat_then_split"])
def test_packed_rows_are_the_same_for_0_1_and_2_workers(name):
    runs = [list(PACKERS[name](loader_stream(w)).batch(3)) for w in (0, 1, 2)]
    assert_streams_equal(runs[0], runs[1])
    assert_streams_equal(runs[0], runs[2])


def loader_with_packer(workers=0):
    return dl.DataLoader(
        dl.RangeDataSource(len(LENGTHS)),
        dl.IndexSampler(len(LENGTHS), shuffle=True, seed=5, num_epochs=1),
        [dl.MapTransform(tokens),
         dl.FirstFitPack({"tokens": 64}, num_packing_bins=4, seed=2),
         dl.RandomMapTransform(lambda row, rng: {**row, "noise": rng.integers(1 << 20)}),
         dl.Batch(2, drop_remainder=True)],
        worker_count=workers,
    )


def test_a_data_loader_packs_like_the_dataset_api():
    via_loader = list(loader_with_packer())
    via_dataset = list(PACKERS["first_fit"](loader_stream()).batch(2, drop_remainder=True))
    assert len(via_loader) == len(via_dataset)
    for a, b in zip(via_loader, via_dataset):
        assert a["tokens"].tolist() == b["tokens"].tolist()


def test_a_data_loader_with_a_packer_restores_at_every_step():
    assert_restores_everywhere(lambda: loader_with_packer().iterator(), limit=25, fresh_iterator_every=2)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_data_loader_with_a_packer_gives_the_same_batches_with_two_workers():
    assert_streams_equal(list(loader_with_packer(2)), list(loader_with_packer(0)))


def test_a_data_loader_state_names_the_operations_after_the_packer():
    it = loader_with_packer().iterator()
    next(it)
    state = it.get_state()
    other = dl.DataLoader(
        dl.RangeDataSource(len(LENGTHS)), dl.IndexSampler(len(LENGTHS), shuffle=True, seed=5, num_epochs=1),
        [dl.MapTransform(tokens), dl.FirstFitPack({"tokens": 64}, num_packing_bins=4, seed=2), dl.Batch(3)])
    with pytest.raises(dl.StateMismatchError, match=r"saved for the operations .*Batch\(2.* but this loader has .*Batch\(3"):
        other.iterator(state)


def test_a_batch_before_a_packer_is_refused_with_a_hint():
    with pytest.raises(ValueError, match=r"operations\[1\] is a Batch before the packer operations\[2\] .* put the Batch after it"):
        dl.DataLoader(dl.RangeDataSource(10), dl.IndexSampler(10),
                      [dl.MapTransform(tokens), dl.Batch(2), dl.ConcatThenSplit({"tokens": 8})])


# Row order, pinned to Grain's: sequence i + 1 (lengths below) is a run of the value i + 1,
# and each row is listed as the sequences it holds, in the order Grain 0.2.18's
# FirstFitPackIterDataset / BestFitPackIterDataset hand the rows out (length_struct
# {"t": 8}, 3 bins). Grain permutes a round's rows with default_rng(seed + rows before).
ORDER_LENGTHS = [4, 5, 3, 2, 6, 1, 7, 2, 3, 5, 4, 4, 1, 6, 2, 3]
GRAIN_ROWS = [
    ("first", {}, [[5], [1, 3, 6], [2, 4], [10], [8, 9], [7], [11, 12], [13, 14], [15, 16]]),
    ("best", {}, [[5], [1, 4, 6], [2, 3], [10], [8, 9], [7], [11, 12], [13, 14], [15, 16]]),
    ("first", {"seed": 5}, [[2, 4], [5], [1, 3, 6], [8, 9], [10], [7], [13, 14], [11, 12], [15, 16]]),
    ("best", {"seed": 5}, [[2, 3], [5], [1, 4, 6], [8, 9], [10], [7], [13, 14], [11, 12], [15, 16]]),
    ("first", {"shuffle_bins": False}, [[1, 3, 6], [2, 4], [5], [7], [8, 9], [10], [11, 12], [13, 14], [15, 16]]),
    ("first", {"shuffle_bins_group_by_feature": "t_segment_ids"},
     [[5], [2, 4], [1, 3, 6], [10], [7], [8, 9], [11, 12], [13, 14], [15, 16]]),
    ("best", {"shuffle_bins_group_by_feature": "t"},
     [[2, 3], [1, 4, 6], [5], [7], [8, 9], [10], [11, 12], [13, 14], [15, 16]]),
]


def order_stream():
    return dl.MapDataset.source(
        [{"t": np.full(n, i + 1, np.int32)} for i, n in enumerate(ORDER_LENGTHS)]).to_iter_dataset()


def held(row):
    return [int(x) for x in dict.fromkeys(row["t"].tolist()) if x]


@pytest.mark.parametrize(("packer", "kwargs", "expected"), GRAIN_ROWS)
def test_fit_packers_hand_out_rows_in_grains_order(packer, kwargs, expected):
    cls = dl.experimental.FirstFitPackIterDataset if packer == "first" else dl.experimental.BestFitPackIterDataset
    ds = cls(order_stream(), length_struct={"t": 8}, num_packing_bins=3, **kwargs)
    rows = list(ds)
    assert [held(r) for r in rows] == expected
    # Grain's first row with the default seed, whole: segments and positions too
    if packer == "first" and not kwargs:
        assert rows[1]["t"].tolist() == [1, 1, 1, 1, 3, 3, 3, 6]
        assert rows[1]["t_segment_ids"].tolist() == [1, 1, 1, 1, 2, 2, 2, 3]
        assert rows[1]["t_positions"].tolist() == [0, 1, 2, 3, 0, 1, 2, 0]
    assert_restores_everywhere(lambda: iter(ds), limit=len(expected))


def test_concat_then_split_passing_full_length_rows_through_restores_at_every_step():
    """A fill's row and the full-length rows after it: a state between them fills again."""
    lengths = [3, 6, 2, 5, 6, 4, 6, 6, 1, 2, 6, 3, 5]
    stream = dl.MapDataset.source([{"t": np.full(n, i + 1, np.int32)} for i, n in enumerate(lengths)])
    ds = dl.experimental.ConcatThenSplitIterDataset(
        stream.to_iter_dataset(), length_struct={"t": 6}, split_full_length_features=False)
    rows = assert_restores_everywhere(lambda: iter(ds), limit=20)
    assert [r["t"].tolist() for r in rows] == [  # what grain 0.2.18 gives
        [1, 1, 1, 3, 3, 4], [2, 2, 2, 2, 2, 2], [4, 4, 4, 4, 6, 6], [5, 5, 5, 5, 5, 5],
        [6, 6, 9, 10, 10, 12], [7, 7, 7, 7, 7, 7], [8, 8, 8, 8, 8, 8], [11, 11, 11, 11, 11, 11],
        [12, 12, 13, 13, 13, 13], [13, 0, 0, 0, 0, 0]]
    it = iter(ds)
    next(it)
    state = it.get_state()
    assert state["skip"] == 1 and state["offsets"] == {}  # row 2 comes from the fill of row 1
    it = iter(ds)
    it.set_state(json.loads(json.dumps(state)))
    assert next(it)["t"].tolist() == [2, 2, 2, 2, 2, 2]


def test_nested_meta_features_pack_and_restore_at_every_step():
    stream = dl.MapDataset.range(40).map(lambda i: {
        "t": np.full(i % 7 + 1, i, np.int32), "x": {"ids": np.full(i % 3 + 1, i), "k": np.int64(i)}})
    ds = dl.experimental.BestFitPackIterDataset(
        stream.to_iter_dataset(), length_struct={"t": 16, "x": {"ids": 8, "k": 4}}, num_packing_bins=3,
        meta_features=["x"])
    rows = assert_restores_everywhere(lambda: iter(ds), limit=30)
    assert all(sorted(r["x"]) == ["ids", "k"] and r["x"]["k"].shape == (4,) for r in rows)
    held = sorted(int(k) for r in rows for k, s in zip(r["x"]["k"], range(4)) if s < len(set(r["t_segment_ids"]) - {0}))
    assert held == list(range(40))


_FIT_SIGNATURE = (
    "(parent: 'IterDataset', *, length_struct: 'Any', num_packing_bins: 'int', seed: 'int' = 0, "
    "shuffle_bins: 'bool' = True, shuffle_bins_group_by_feature: 'str | None' = None, "
    "meta_features: 'Sequence[str]' = (), pack_alignment_struct: 'Any' = None, "
    "padding_struct: 'Any' = None, max_sequences_per_bin: 'int | None' = None) -> 'None'"
)


@pytest.mark.parametrize(("name", "expected"), [
    ("FirstFitPackIterDataset", _FIT_SIGNATURE),
    ("BestFitPackIterDataset", _FIT_SIGNATURE),
    ("ConcatThenSplitIterDataset",
     "(parent: 'IterDataset', *, length_struct: 'Mapping[str, int]', "
     "meta_features: 'Collection[str]' = (), split_full_length_features: 'bool' = True, "
     "bos_handling: 'BOSHandling' = <BOSHandling.DO_NOTHING: 1>, "
     "bos_features: 'Collection[str]' = (), bos_token_id: 'int | None' = None) -> 'None'"),
])
def test_packing_datasets_keep_grains_signatures(name, expected):
    # Grain's names, order, keyword-only arguments and defaults: code written for Grain
    # (and tools reading the signature) must see the same parameters.
    assert str(inspect.signature(getattr(dl.experimental, name))) == expected


def test_packing_datasets_refuse_a_positional_or_unknown_argument():
    ds = dl.MapDataset.range(3).map(tokens).to_iter_dataset()
    with pytest.raises(TypeError):
        dl.experimental.FirstFitPackIterDataset(ds, {"tokens": 8}, 2)
    with pytest.raises(TypeError, match="num_bins"):
        dl.experimental.BestFitPackIterDataset(ds, length_struct={"tokens": 8}, num_bins=2)
    with pytest.raises(TypeError, match="length_struct"):
        dl.experimental.ConcatThenSplitIterDataset(ds)
