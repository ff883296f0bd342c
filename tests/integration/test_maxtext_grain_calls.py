"""MaxText's Grain calls, made through the grain alias with MaxText's arguments.

MaxText's Grain input pipeline (``input_pipeline/grain_data_processing.py`` and
``data_processing_utils.py``, commit e591f30) says ``import grain.python as grain`` and
calls a fixed set of Grain names with a fixed set of arguments. Each test below makes
one of those calls the way MaxText makes it, on small data written here (ArrayRecord,
TFRecord and Parquet files of ``tf.train.Example`` / text rows, a SentencePiece model
trained here), and checks the result against a computation of its own: the records
written, the token ids of the model, the rows a packer must produce, the batches of an
uninterrupted run. Nothing here imports MaxText; the pipeline steps are written anew.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import json
import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataloader as dl
from dataloader.maxtext.records import encode_example, parse_example
from tests import tokenizer_files

LENGTH = 24  # MaxText's max_target_length: two short texts fit a row, a doubled one is cut
BATCH = 4  # MaxText's local batch (per_device_batch_size x devices)
FILES = 3
PER_FILE = 30
SEED = 5
BOS, EOS, PAD = 1, 2, 0  # the test model: unk 0 (MaxText pads with unk when there is no pad), bos 1, eos 2
READ = {"num_threads": 16, "prefetch_buffer_size": 500}  # base.yml's grain_num_threads / prefetch


@pytest.fixture(scope="module")
def grain():
    """``import grain.python as grain`` on granary, as MaxText's pipeline modules say it;
    the alias is removed after the module."""
    from dataloader.compat import install_grain_alias, uninstall_grain_alias

    install_grain_alias()
    import grain.experimental
    import grain.python

    yield grain.python
    uninstall_grain_alias()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Three files in each format (the same 30 texts per file in every format) and a
    SentencePiece model."""
    folder = tmp_path_factory.mktemp("maxtext_grain_calls")
    lines = tokenizer_files.corpus(FILES * PER_FILE)
    # Distinct texts of 7-15 tokens; every tenth is doubled (up to 29 tokens: three are cut).
    texts = [[lines[f * PER_FILE + j] * (2 if j % 10 == 0 else 1) for j in range(PER_FILE)] for f in range(FILES)]
    out: dict[str, Any] = {"texts": texts, "model": tokenizer_files.sentencepiece_model(str(folder))}
    for kind in ("array_record", "tfrecord", "parquet"):
        out[kind] = [str(folder / f"part-{f}.{kind}") for f in range(FILES)]
    for f in range(FILES):
        records = [encode_example({"text": t}) for t in texts[f]]
        dl.write_array_record(out["array_record"][f], records)
        dl.write_tfrecord(out["tfrecord"][f], records)
        pq.write_table(pa.table({"text": texts[f]}), out["parquet"][f], row_group_size=8)
    return out


# --- the pipeline's steps, written for these tests (module level: workers import them) ---

_MODELS: dict[str, Any] = {}


def _processor(path: str) -> Any:
    if path not in _MODELS:
        import sentencepiece

        _MODELS[path] = sentencepiece.SentencePieceProcessor(model_file=path)
    return _MODELS[path]


def token_ids(text: str, model: str) -> list[int]:
    """BOS, the model's ids, EOS, cut to LENGTH (MaxText's add_bos/add_eos and truncation)."""
    return ([BOS, *_processor(model).encode(text), EOS])[:LENGTH]


def parse_text(record: bytes) -> dict[str, str]:
    """The ``text`` feature of a serialized tf.train.Example."""
    return {"text": parse_example(record)["text"][0].decode()}


def tokenize(element: dict[str, Any], model: str) -> dict[str, np.ndarray]:
    """The text's ids as MaxText's ``inputs`` and ``targets`` (its tokenize and rekey steps)."""
    ids = np.asarray(token_ids(element["text"], model), np.int32)
    return {"inputs": ids, "targets": ids.copy()}


def pad_to_length(element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Unpacked rows in MaxText's layout: ids padded to LENGTH, segmentation and position."""
    out = {}
    for key, ids in element.items():
        out[key] = np.pad(ids, (0, LENGTH - len(ids)), constant_values=PAD)
        out[f"{key}_segmentation"] = (np.arange(LENGTH) < len(ids)).astype(np.int32)
        out[f"{key}_position"] = np.arange(LENGTH, dtype=np.int32)
    return out


def maxtext_names(element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Grain's packer names to MaxText's (``inputs_segment_ids`` -> ``inputs_segmentation``)."""
    return {k.replace("_segment_ids", "_segmentation").replace("_positions", "_position"): v
            for k, v in element.items()}


def expected_row(text: str, model: str) -> dict[str, np.ndarray]:
    """The unpacked row one text must become, computed from the text with plain lists."""
    ids = token_ids(text, model)
    n = len(ids)
    row = np.array(ids + [PAD] * (LENGTH - n), np.int32)
    seg = np.array([1] * n + [0] * (LENGTH - n), np.int32)
    pos = np.arange(LENGTH, dtype=np.int32)
    return {f"{k}{s}": v for k in ("inputs", "targets") for s, v in (("", row), ("_segmentation", seg), ("_position", pos))}


def texts_of(source: Any) -> list[str]:
    """The texts of a MapDataset of Example records, read by index."""
    return [parse_text(source[i])["text"] for i in range(len(source))]


def records_of(grain: Any, files: list[str], *, hosts: tuple[int, int] = (0, 1), epochs: int | None = 1,
               reader_options: dict[str, str] | None = None) -> Any:
    """MaxText's ArrayRecord source: shuffle, repeat, host slice, then an IterDataset."""
    ds = grain.MapDataset.source(grain.ArrayRecordDataSource(files, reader_options=reader_options))
    ds = ds.shuffle(seed=SEED).repeat(epochs)[hosts[0]::hosts[1]]
    return ds.to_iter_dataset(read_options=grain.ReadOptions(**READ))


def padded_batches(grain: Any, data: dict[str, Any]) -> Any:
    """MaxText's pretraining pipeline without packing, up to its batch."""
    ds = records_of(grain, data["array_record"]).map(parse_text)
    ds = ds.map(functools.partial(tokenize, model=data["model"])).map(pad_to_length)
    return ds.batch(BATCH, batch_fn=functools.partial(grain.experimental.batch_and_pad, batch_size=BATCH,
                                                      pad_value=PAD))


def padded_pipeline(grain: Any, data: dict[str, Any], workers: Any) -> Any:
    """The batches behind mp_prefetch, as MaxText ends every pipeline (workers 0 included)."""
    if not isinstance(workers, grain.MultiprocessingOptions):
        workers = grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=1)
    return padded_batches(grain, data).mp_prefetch(workers)


def packed_pipeline(grain: Any, data: dict[str, Any], workers: int, packing: str = "first_fit",
                    mixture: bool = False) -> Any:
    """MaxText's pretraining pipeline with packing (two epochs, so it outlasts the tests),
    reading one pattern or, with ``mixture``, two mixed 3:1 by name."""
    if mixture:
        parts = {"alpha": records_of(grain, data["array_record"][:2], epochs=2),
                 "beta": records_of(grain, data["array_record"][2:], epochs=2)}
        ds = grain.IterDataset.mix(parts, {"alpha": 0.75, "beta": 0.25}).map(parse_text)
    else:
        ds = records_of(grain, data["array_record"], epochs=2).map(parse_text)
    ds = ds.map(functools.partial(tokenize, model=data["model"]))
    ds = packer(grain, ds, packing).map(maxtext_names)
    ds = ds.batch(BATCH, batch_fn=functools.partial(grain.experimental.batch_and_pad, batch_size=BATCH, pad_value=PAD))
    return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=1))


def packer(grain: Any, ds: Any, packing: str, max_segments: int | None = None) -> Any:
    """The packer MaxText's grain_packing_type names, with MaxText's arguments."""
    lengths = {"inputs": LENGTH, "targets": LENGTH}
    if packing == "first_fit":
        return grain.experimental.FirstFitPackIterDataset(
            ds, length_struct=lengths, num_packing_bins=BATCH, max_sequences_per_bin=max_segments)
    if packing == "best_fit":
        return grain.experimental.BestFitPackIterDataset(ds, length_struct=lengths, num_packing_bins=BATCH)
    return grain.experimental.ConcatThenSplitIterDataset(
        ds, length_struct=lengths, bos_handling=grain.experimental.BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS,
        bos_token_id=BOS)


def first(ds: Any, n: int) -> list[Any]:
    """The first ``n`` elements of a fresh iterator of ``ds``, which is then closed."""
    it = iter(ds)
    try:
        return [next(it) for _ in range(n)]
    finally:
        close(it)


def close(it: Any) -> None:
    """Ends an iterator's worker processes now rather than at garbage collection."""
    if hasattr(it, "close"):
        it.close()


def as_lists(batches: list[dict[str, np.ndarray]]) -> list[dict[str, list]]:
    """Batches as plain lists, so two runs compare with ``==`` and a diff shows where."""
    return [{k: np.asarray(v).tolist() for k, v in sorted(b.items())} for b in batches]


def segments(row: dict[str, np.ndarray], key: str = "inputs") -> list[list[int]]:
    """The sequences packed into one row, read back by segment id; positions checked."""
    ids, seg, pos = (np.asarray(row[f"{key}{s}"]) for s in ("", "_segmentation", "_position"))
    out = []
    for s in sorted(set(seg.tolist()) - {0}):
        cells = np.flatnonzero(seg == s)
        assert pos[cells].tolist() == list(range(len(cells))), f"positions of segment {s}: {pos[cells]}"
        out.append(ids[cells].tolist())
    assert ids[seg == 0].tolist() == [PAD] * int((seg == 0).sum()), "padding cells hold the pad id"
    return out


# --- the calls ---


@pytest.mark.parametrize("reader_options", [None, {"index_storage_option": "in_memory"},
                                            {"index_storage_option": "offloaded"}])
def test_array_record_source_with_maxtexts_reader_options_reads_every_record(grain, data, reader_options):
    source = grain.ArrayRecordDataSource(data["array_record"], reader_options=reader_options)
    assert len(source) == FILES * PER_FILE
    written = [t for texts in data["texts"] for t in texts]
    assert texts_of(source) == written
    assert texts_of(grain.MapDataset.source(source)) == written


@pytest.mark.parametrize("hosts", [1, 2, 3])
def test_shuffle_repeat_and_host_slice_give_each_host_every_nth_position(grain, data, hosts):
    source = grain.ArrayRecordDataSource(data["array_record"])
    everything = grain.MapDataset.source(source).shuffle(seed=SEED).repeat(2)
    order = texts_of(everything)
    written = sorted(t for texts in data["texts"] for t in texts)
    epoch = FILES * PER_FILE
    assert sorted(order[:epoch]) == written and sorted(order[epoch:]) == written
    assert order[:epoch] != order[epoch:], "each epoch has its own order"
    for host in range(hosts):
        stream = [parse_text(r)["text"] for r in records_of(grain, data["array_record"], hosts=(host, hosts), epochs=2)]
        assert stream == order[host::hosts]


@pytest.mark.parametrize("form", ["named (mixture config file)", "list (';' patterns)"])
def test_iter_mix_takes_components_by_weight_in_their_own_order_and_resumes(grain, data, form):
    alpha = records_of(grain, data["array_record"][:2]).map(parse_text)
    beta = records_of(grain, data["array_record"][2:]).map(parse_text)
    if form.startswith("named"):
        mixed = grain.IterDataset.mix({"alpha": alpha, "beta": beta}, {"alpha": 3 / 4, "beta": 1 / 4})
    else:
        mixed = grain.IterDataset.mix([alpha, beta], [round(3 / 4, 4), round(1 / 4, 4)])
    out = [e["text"] for e in itertools.islice(mixed, 40)]
    alpha_order = [e["text"] for e in alpha]
    from_alpha = [t for t in out if t in set(alpha_order)]
    from_beta = [t for t in out if t not in set(alpha_order)]
    assert abs(len(from_alpha) - 30) <= 1, f"{len(from_alpha)} of 40 from the component of weight 3/4"
    assert from_alpha == alpha_order[:len(from_alpha)]
    assert from_beta == [e["text"] for e in itertools.islice(beta, len(from_beta))]

    it = iter(mixed)
    head = [next(it)["text"] for _ in range(13)]
    state = json.loads(json.dumps(it.get_state()))
    resumed = iter(mixed)
    resumed.set_state(state)
    assert head == out[:13]
    assert [next(resumed)["text"] for _ in range(20)] == out[13:33]


def test_a_named_mix_state_restores_under_new_weights_with_each_component_where_it_was(grain, data):
    # MaxText mixes named components with IterDataset.mix so that a run can change its
    # mixture file and resume: each component continues from its own position.
    def mixed(weights: dict[str, float]) -> Any:
        parts = {"alpha": records_of(grain, data["array_record"][:2]).map(parse_text),
                 "beta": records_of(grain, data["array_record"][2:]).map(parse_text)}
        return grain.IterDataset.mix(parts, weights)

    alpha_order = [e["text"] for e in records_of(grain, data["array_record"][:2]).map(parse_text)]
    beta_order = [e["text"] for e in records_of(grain, data["array_record"][2:]).map(parse_text)]
    it = iter(mixed({"alpha": 0.75, "beta": 0.25}))
    head = [next(it)["text"] for _ in range(12)]
    state = json.loads(json.dumps(it.get_state()))
    resumed = iter(mixed({"alpha": 0.5, "beta": 0.5}))
    resumed.set_state(state)
    tail = [next(resumed)["text"] for _ in range(20)]
    for order in (alpha_order, beta_order):
        taken = [t for t in head + tail if t in set(order)]
        assert taken == order[:len(taken)], "each component resumes where it stopped, nothing repeated or skipped"
    assert abs(sum(t in set(beta_order) for t in tail) - 10) <= 1, "the new weights hold after the restore"


def _token_stream(grain: Any, data: dict[str, Any]) -> tuple[Any, list[list[int]]]:
    """An unshuffled, one-epoch stream of token ids, and the ids it must carry."""
    ds = grain.MapDataset.source(grain.ArrayRecordDataSource(data["array_record"])).repeat(1)[0::1]
    ds = ds.to_iter_dataset(read_options=grain.ReadOptions(**READ)).map(parse_text)
    ds = ds.map(functools.partial(tokenize, model=data["model"]))
    expected = [token_ids(t, data["model"]) for texts in data["texts"] for t in texts]
    return ds, expected


def _batched(grain: Any, ds: Any) -> list[dict[str, np.ndarray]]:
    ds = ds.map(maxtext_names)
    ds = ds.batch(BATCH, batch_fn=functools.partial(grain.experimental.batch_and_pad, batch_size=BATCH, pad_value=PAD))
    return list(ds)


@pytest.mark.parametrize(("packing", "max_segments"), [("first_fit", None), ("first_fit", 2), ("best_fit", None)])
def test_fit_packers_with_maxtexts_arguments_keep_every_sequence_whole(grain, data, packing, max_segments):
    ds, expected = _token_stream(grain, data)
    batches = _batched(grain, packer(grain, ds, packing, max_segments))
    packed = []
    for batch in batches:
        assert {k: v.shape for k, v in batch.items()} == {
            f"{k}{s}": (BATCH, LENGTH) for k in ("inputs", "targets") for s in ("", "_segmentation", "_position")}
        for i in range(BATCH):
            row = {k: v[i] for k, v in batch.items()}
            assert segments(row, "inputs") == segments(row, "targets")
            found = segments(row)
            assert max_segments is None or len(found) <= max_segments
            packed += found
    assert collections.Counter(map(tuple, packed)) == collections.Counter(map(tuple, expected))
    assert len(batches) < len(expected) / BATCH, "rows hold more than one sequence"


def test_concat_then_split_with_maxtexts_bos_arguments_cuts_the_token_stream_into_rows(grain, data):
    # MaxText passes bos_handling and bos_token_id but no bos_features, so (in Grain 0.2.18
    # as here) no feature gets a BOS: the rows are the token stream cut every LENGTH.
    ds, expected = _token_stream(grain, data)
    rows = [{k: v[i] for k, v in b.items()} for b in _batched(grain, packer(grain, ds, "concat_then_split"))
            for i in range(BATCH)]
    stream = [t for ids in expected for t in ids]
    # Which sequence each token of the stream came from: a row's segments follow it.
    origin = [n for n, ids in enumerate(expected) for _ in ids]
    full = len(stream) // LENGTH
    for k, row in enumerate(rows[:full]):
        cut = slice(k * LENGTH, (k + 1) * LENGTH)
        assert row["inputs"].tolist() == stream[cut], f"row {k}"
        first = origin[cut][0]
        assert row["inputs_segmentation"].tolist() == [n - first + 1 for n in origin[cut]], f"row {k}"
        starts = {c: origin[cut].index(n) for c, n in enumerate(origin[cut])}
        assert row["inputs_position"].tolist() == [c - starts[c] for c in range(LENGTH)], f"row {k}"
    rest = stream[full * LENGTH:]
    assert rows[full]["inputs"].tolist()[:len(rest)] == rest
    assert all(r["inputs_segmentation"].sum() == 0 for r in rows[full + 1:]), "only batch padding after the stream"


def test_batch_and_pad_fills_the_last_batch_with_the_pad_value(grain, data):
    ds, expected = _token_stream(grain, data)
    ds = ds.map(pad_to_length)
    batches = list(ds.batch(BATCH, batch_fn=functools.partial(grain.experimental.batch_and_pad, batch_size=BATCH,
                                                              pad_value=7)))
    assert len(batches) == -(-len(expected) // BATCH)
    assert all(b["inputs"].shape == (BATCH, LENGTH) for b in batches)
    short = len(expected) % BATCH
    tail = batches[-1]
    assert (tail["inputs"][short:] == 7).all() and (tail["inputs_segmentation"][short:] == 7).all()
    assert tail["inputs"][:short].tolist() == [ids + [PAD] * (LENGTH - len(ids)) for ids in expected[-short:]]


def test_padded_pipeline_in_process_gives_the_batches_computed_from_the_records(grain, data):
    source = grain.MapDataset.source(grain.ArrayRecordDataSource(data["array_record"])).shuffle(seed=SEED)
    order = texts_of(source)
    it = iter(padded_pipeline(grain, data, 0))
    assert isinstance(it, grain.DatasetIterator), "MaxText's checkpointing checks this to save JSON"
    got = list(it)
    assert len(got) == -(-len(order) // BATCH)
    for k, batch in enumerate(got):
        rows = [expected_row(t, data["model"]) for t in order[k * BATCH:(k + 1) * BATCH]]
        for key, value in batch.items():
            want = np.stack([r[key] for r in rows])
            assert value[:len(rows)].tolist() == want.tolist(), f"batch {k} {key}"
            assert (value[len(rows):] == PAD).all()


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("packing", ["false", "first_fit", "concat_then_split", "first_fit of a mixture"])
def test_worker_counts_do_not_change_maxtexts_batches(grain, data, packing):
    # Granary's promise, stronger than Grain's: under Grain 0.2.18 each worker batches (and
    # packs) its own slice of the stream, so grain_worker_count changes MaxText's batches.
    if packing == "false":
        runs = [first(padded_pipeline(grain, data, w), 12) for w in (0, 2)]
    else:
        kind, _, mixture = packing.partition(" of a ")
        runs = [first(packed_pipeline(grain, data, w, kind, mixture=bool(mixture)), 12) for w in (0, 2)]
    assert len(runs[0]) == 12
    assert as_lists(runs[1]) == as_lists(runs[0])


@pytest.mark.slow
@pytest.mark.multiprocess
def test_pick_performance_config_as_maxtext_calls_it_gives_options_that_keep_the_batches(grain, data):
    config = grain.experimental.pick_performance_config(ds=padded_batches(grain, data), ram_budget_mb=1024,
                                                        max_workers=None, max_buffer_size=None)
    options = config.multiprocessing_options
    assert isinstance(options, grain.MultiprocessingOptions)
    assert 0 <= options.num_workers <= (os.cpu_count() or 1) and options.per_worker_buffer_size >= 1
    reference = first(padded_pipeline(grain, data, 0), 10)
    assert as_lists(first(padded_pipeline(grain, data, options), 10)) == as_lists(reference)


def _elastic(grain: Any, ds: Any, shard: int, shards: int, workers: int = 0) -> Any:
    """MaxText's ElasticIterator: options only with grain_worker_count > 0."""
    options = grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=1) if workers > 0 else None
    return grain.experimental.ElasticIterator(
        ds, global_batch_size=2 * BATCH, shard_options=grain.ShardOptions(shard_index=shard, shard_count=shards),
        read_options=grain.ReadOptions(**READ), multiprocessing_options=options)


def _elastic_source(grain: Any, data: dict[str, Any]) -> Any:
    """MaxText's elastic path: shuffled and repeated, never sliced, mapped up to the padding."""
    ds = grain.MapDataset.source(grain.ArrayRecordDataSource(data["array_record"])).shuffle(seed=SEED).repeat(1)
    return ds.map(parse_text).map(functools.partial(tokenize, model=data["model"])).map(pad_to_length)


@pytest.mark.parametrize("shards", [1, 2])
def test_elastic_iterator_deals_each_global_batch_across_shards_and_resumes(grain, data, shards):
    ds = _elastic_source(grain, data)
    order = [e["inputs"].tolist() for e in (ds[i] for i in range(len(ds)))]
    iterators = [_elastic(grain, ds, s, shards) for s in range(shards)]
    per_shard = 2 * BATCH // shards
    for k in range(3):
        for s, it in enumerate(iterators):
            batch = next(it)
            assert batch["inputs"].shape == (per_shard, LENGTH)
            window = range(k * 2 * BATCH, (k + 1) * 2 * BATCH)
            assert batch["inputs"].tolist() == [order[j] for j in window if j % shards == s], f"batch {k} shard {s}"
    state = json.loads(json.dumps(iterators[0].get_state()))
    # Elastic resume: the state restores on another shard count; global batch 3 follows.
    other = 3 - shards
    resumed = [_elastic(grain, ds, s, other) for s in range(other)]
    for it in resumed:
        it.set_state(state)
    rows = sorted(row for it in resumed for row in next(it)["inputs"].tolist())
    assert rows == sorted(order[3 * 2 * BATCH:4 * 2 * BATCH])


@pytest.mark.slow
@pytest.mark.multiprocess
def test_elastic_iterator_with_maxtexts_worker_options_gives_the_in_process_batches(grain, data):
    ds = _elastic_source(grain, data)
    runs = []
    for workers in (0, 2):
        it = _elastic(grain, ds, 1, 2, workers)
        try:
            runs.append(as_lists([next(it) for _ in range(5)]))
        finally:
            close(it)
    assert runs[1] == runs[0]


@pytest.mark.parametrize("fmt", ["parquet", "tfrecord"])
def test_file_stream_path_interleaves_shuffled_files_and_window_shuffles(grain, data, fmt):
    make = grain.experimental.ParquetIterDataset if fmt == "parquet" else grain.experimental.TFRecordIterDataset
    files = data[fmt]
    by_file = dict(zip(files, data["texts"]))
    file_order = list(grain.MapDataset.source(files).shuffle(seed=SEED))
    assert sorted(file_order) == sorted(files)

    def text(element: Any) -> str:
        return element["text"] if fmt == "parquet" else parse_text(element)["text"]

    def stream(host: int, hosts: int, window: int | None) -> Any:
        ds = grain.MapDataset.source(files).shuffle(seed=SEED).repeat(1)[slice(host, None, hosts)].map(make)
        ds = grain.experimental.InterleaveIterDataset(ds, cycle_length=min(len(files[host::hosts]), READ["num_threads"]))
        if window:
            ds = grain.experimental.WindowShuffleIterDataset(ds, window_size=window, seed=SEED)
        return ds

    # One host: the files in their shuffled order, one element of each in turn.
    plain = [text(e) for e in stream(0, 1, None)]
    assert plain == [t for row in zip(*(by_file[f] for f in file_order)) for t in row]
    # One file per host: each host reads its file of the shuffled order, start to end.
    for host in range(FILES):
        assert [text(e) for e in stream(host, FILES, None)] == by_file[file_order[host]]
    # The window shuffle keeps each window's elements and moves them within it.
    shuffled = [text(e) for e in stream(0, 1, 10)]
    assert shuffled != plain
    assert all(sorted(shuffled[i:i + 10]) == sorted(plain[i:i + 10]) for i in range(0, len(plain), 10))

    it = iter(stream(0, 1, 10))
    head = [text(next(it)) for _ in range(17)]
    state = json.loads(json.dumps(it.get_state()))
    resumed = iter(stream(0, 1, 10))
    resumed.set_state(state)
    assert head + [text(e) for e in resumed] == shuffled


def test_an_iter_dataset_subclass_of_ones_own_shards_a_file_among_hosts_by_index(grain, data):
    # MaxText's answer to fewer files than hosts: hosts that share a file keep every n-th
    # record of it, through an IterDataset and a DatasetIterator subclassed from Grain's.
    class EveryNthIterator(grain.DatasetIterator):
        def __init__(self, parent, index, count):
            super().__init__(parent)
            self._index, self._count, self._seen = index, count, 0

        def __next__(self):
            while True:
                value, self._seen = next(self._parent), self._seen + 1
                if (self._seen - 1) % self._count == self._index:
                    return value

        def get_state(self):
            return {"seen": self._seen, "parent": self._parent.get_state()}

        def set_state(self, state):
            self._seen = state["seen"]
            self._parent.set_state(state["parent"])

    class EveryNth(grain.IterDataset):
        def __init__(self, parent, index, count):
            super().__init__(parent)
            self._index, self._count = index, count

        def __iter__(self):
            return EveryNthIterator(self._parent.__iter__(), self._index, self._count)

    def host(index: int, count: int) -> Any:
        ds = grain.MapDataset.source(data["parquet"][1:2]).repeat(1).map(grain.experimental.ParquetIterDataset)
        ds = EveryNth(grain.experimental.InterleaveIterDataset(ds, cycle_length=1), index, count)
        return ds.map(lambda row: row["text"])

    texts = data["texts"][1]
    assert [list(host(i, 3)) for i in range(3)] == [texts[i::3] for i in range(3)]
    it = iter(host(1, 3))
    head = [next(it) for _ in range(4)]
    state = json.loads(json.dumps(it.get_state()))
    resumed = iter(host(1, 3))
    resumed.set_state(state)
    assert head + list(resumed) == texts[1::3]


def test_grains_private_tfrecord_reader_names_resolve_for_a_reader_of_ones_own(grain, data):
    from grain._src.python.dataset.sources.tfrecord_dataset import (
        _TFRecordDatasetIterator,
        _TFRecordReader,
    )

    class LocalIterator(_TFRecordDatasetIterator):
        """As MaxText's GCS iterator: skips the parent's __init__ and brings its own reader."""

        def __init__(self, path: str) -> None:
            grain.DatasetIterator.__init__(self)
            self._reader = _TFRecordReader(path)

    it = LocalIterator(data["tfrecord"][1])
    assert [parse_text(next(it))["text"] for _ in range(5)] == data["texts"][1][:5]
    state = it.get_state()
    rest = [parse_text(r)["text"] for r in it]
    it.set_state(state)
    assert rest == data["texts"][1][5:] == [parse_text(r)["text"] for r in it]


def _handler_and_args(grain: Any) -> tuple[Any, Any, Any]:
    """A handler made as MaxText makes its own: Grain's PyGrainCheckpointHandler plus Orbax's
    CheckpointHandler, writing one ``process_<i>-of-<n>.json`` per iterator it is given."""
    import orbax.checkpoint as ocp

    class IteratorHandler(grain.PyGrainCheckpointHandler, ocp.CheckpointHandler):
        def save(self, directory, item=None, args=None):
            item = item or args.item
            for iterator, index, count in item if isinstance(item, list) else [(item, 0, 1)]:
                (directory / f"process_{index}-of-{count}.json").write_text(json.dumps(iterator.get_state()))

        def restore(self, directory, item=None, args=None):
            item = item or args.item
            item.set_state(json.loads((directory / f"process_{args.process_index}-of-{args.process_count}.json").read_text()))
            return item

    # The save and restore arguments MaxText registers for its handler (restore names the file).
    save = dataclasses.make_dataclass("Save", [("item", Any)], bases=(ocp.args.CheckpointArgs,))
    restore = dataclasses.make_dataclass(
        "Restore", [("item", Any), ("process_index", int, 0), ("process_count", int, 1)],
        bases=(ocp.args.CheckpointArgs,))
    ocp.args.register_with_handler(IteratorHandler, for_save=True)(save)
    ocp.args.register_with_handler(IteratorHandler, for_restore=True)(restore)
    return IteratorHandler, save, restore


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.multiprocess)])
@pytest.mark.parametrize("packing", ["false", "first_fit"])
def test_orbax_checkpoint_through_a_pygrain_handler_subclass_resumes_exactly(grain, data, tmp_path, workers, packing):
    import orbax.checkpoint as ocp

    def pipeline():
        return padded_pipeline(grain, data, workers) if packing == "false" else packed_pipeline(grain, data, workers)

    handler, save, restore = _handler_and_args(grain)
    reference = as_lists(first(pipeline(), 9))
    it = iter(pipeline())
    for _ in range(5):
        next(it)
    manager = ocp.CheckpointManager(tmp_path, item_names=("iter",), item_handlers={"iter": handler()})
    manager.save(5, args=ocp.args.Composite(iter=save(item=[(it, 0, 1)])))
    manager.wait_until_finished()
    assert [p.name for p in (tmp_path / "5" / "iter").glob("process_*.json")] == ["process_0-of-1.json"]
    assert as_lists([next(it) for _ in range(4)]) == reference[5:9], "saving does not move the iterator"
    close(it)

    fresh = iter(pipeline())
    manager = ocp.CheckpointManager(tmp_path, item_names=("iter",), item_handlers={"iter": handler()})
    manager.restore(5, args=ocp.args.Composite(iter=restore(item=fresh)))
    assert as_lists([next(fresh) for _ in range(4)]) == reference[5:9]
    close(fresh)


@pytest.mark.slow
def test_grains_own_checkpoint_args_save_and_restore_a_dataset_iterator(grain, data, tmp_path):
    import orbax.checkpoint as ocp

    reference = as_lists(first(padded_pipeline(grain, data, 0), 8))
    it = iter(padded_pipeline(grain, data, 0))
    for _ in range(3):
        next(it)
    handlers = {"iter": grain.PyGrainCheckpointHandler()}
    manager = ocp.CheckpointManager(tmp_path, item_names=("iter",), item_handlers=handlers)
    manager.save(3, args=ocp.args.Composite(iter=grain.PyGrainCheckpointSave(it)))
    manager.wait_until_finished()
    fresh = iter(padded_pipeline(grain, data, 0))
    manager = ocp.CheckpointManager(tmp_path, item_names=("iter",), item_handlers={"iter": grain.PyGrainCheckpointHandler()})
    manager.restore(3, args=ocp.args.Composite(iter=grain.PyGrainCheckpointRestore(fresh)))
    assert as_lists([next(fresh) for _ in range(5)]) == reference[3:8]
