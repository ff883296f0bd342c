"""Tokenize: each library's tokenizer, built here, loaded lazily once per process."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dataloader as dl
from dataloader.operations import tokenizer_backends as backends
from tests import tokenizer_files as tf


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("tokenizers"))
    return {
        "sentencepiece": tf.sentencepiece_model(folder),
        "sentencepiece_nobos": tf.sentencepiece_model(folder, with_bos=False),
        "huggingface": tf.huggingface_json(folder),
        "tiktoken": tf.tiktoken_file(folder),
    }


TEXT = "the loader packs tokens into rows"


def test_sentencepiece_ids_are_the_library_s_with_bos_and_eos(files):
    import sentencepiece as spm

    expected = spm.SentencePieceProcessor(model_file=files["sentencepiece"]).encode(TEXT)
    op = dl.Tokenize(files["sentencepiece"], add_bos=True, add_eos=True)
    out = op.map(TEXT.encode())
    assert op.kind == "sentencepiece" and (op.bos_id, op.eos_id) == (1, 2)
    assert out["tokens"].dtype == np.int32
    assert out["tokens"].tolist() == [1, *expected, 2]
    assert op.decode(out["tokens"][1:-1]) == TEXT


def test_huggingface_ids_are_the_library_s_and_bos_eos_come_from_the_vocabulary(files):
    from tokenizers import Tokenizer

    expected = Tokenizer.from_file(files["huggingface"]).encode(TEXT, add_special_tokens=False).ids
    op = dl.Tokenize(files["huggingface"], add_bos=True, add_eos=True, output_key="ids")
    out = op.map(TEXT)
    assert op.kind == "huggingface" and (op.bos_id, op.eos_id, op.pad_id) == (1, 2, 0)
    assert out["ids"].tolist() == [1, *expected, 2]
    assert op.decode(expected) == TEXT


def test_huggingface_folder_reads_bos_and_eos_from_tokenizer_config(files, tmp_path):
    import json
    import shutil

    shutil.copy(files["huggingface"], tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "</s>", "eos_token": {"content": "<pad>"}}))
    op = dl.Tokenize(str(tmp_path), add_bos=True, add_eos=True)
    assert op.kind == "huggingface" and (op.bos_id, op.eos_id) == (2, 0)


def test_tiktoken_file_ids_by_hand_with_llama3_specials(files):
    # "the" -> t,h -> th (256) -> the (257); " rows" -> ro (260) -> row (261): [" ", row, s].
    op = dl.Tokenize(files["tiktoken"], add_bos=True, add_eos=True)
    n = 256 + len(tf.TIKTOKEN_MERGES)
    assert op.kind == "tiktoken" and (op.bos_id, op.eos_id) == (n, n + 1)
    assert op.map(b"the rows")["tokens"].tolist() == [n, 257, 32, 261, 115, n + 1]
    # Text spelling a special token is data, not the special token.
    assert n not in op.map("<|begin_of_text|>")["tokens"][1:-1].tolist()


def test_a_tiktoken_encoding_by_name_loads_offline_from_a_plugin(files, tmp_path):
    """By name, tiktoken looks encodings up in its ``tiktoken_ext`` plugins. The real ones
    download their file on first use, which tests never do, so a plugin written here names
    the local file; the rest of the path (registry, Encoding, BOS/EOS) is tiktoken's own."""
    plugin = tmp_path / "tiktoken_ext"
    plugin.mkdir()
    (plugin / "granary_local.py").write_text(textwrap.dedent(f"""
        from tiktoken.load import load_tiktoken_bpe
        def small():
            ranks = load_tiktoken_bpe({files["tiktoken"]!r})
            return {{"name": "granary_small", "pat_str": r" ?\\p{{L}}+| ?[^\\s\\p{{L}}]+|\\s+",
                     "mergeable_ranks": ranks, "special_tokens": {{"<|endoftext|>": len(ranks)}}}}
        ENCODING_CONSTRUCTORS = {{"granary_small": small}}
    """))
    script = textwrap.dedent("""
        import json, dataloader as dl
        op = dl.Tokenize("granary_small", add_eos=True)
        print(json.dumps([op.kind, op.bos_id, op.map(b"the rows")["tokens"].tolist()]))
    """)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    n = 256 + len(tf.TIKTOKEN_MERGES)
    assert out.stdout.strip() == f'["tiktoken", null, [257, 32, 261, 115, {n}]]'


def test_an_unknown_tiktoken_encoding_name_is_refused_without_network():
    with pytest.raises(ValueError, match=r"'no_such_encoding' is not a tiktoken encoding; known names: .*cl100k_base"):
        dl.Tokenize("no_such_encoding")


def test_dict_elements_tokenize_their_feature_and_keep_the_other_keys(files):
    op = dl.Tokenize(files["huggingface"], feature="text", add_eos=True)
    out = op.map({"text": b"the rows", "id": 7})
    assert sorted(out) == ["id", "tokens"] and out["id"] == 7 and out["tokens"][-1] == 2
    kept = dl.Tokenize(files["huggingface"], feature="text", keep_text=True).map({"text": "the rows"})
    assert kept["text"] == "the rows"


def test_max_length_trims_as_maxtext_does(files):
    op = dl.Tokenize(files["sentencepiece"], add_bos=True, add_eos=True, max_length=3)
    full = dl.Tokenize(files["sentencepiece"], add_bos=True, add_eos=True).map(TEXT)["tokens"]
    assert op.map(TEXT)["tokens"].tolist() == full[:3].tolist()


def test_bad_arguments_are_refused_at_construction(files, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"sentencepiece tokenizer file '.*missing.model' does not exist"):
        dl.Tokenize(str(tmp_path / "missing.model"))
    with pytest.raises(ValueError, match=r"kind must be one of sentencepiece, huggingface, tiktoken"):
        dl.Tokenize(files["huggingface"], kind="bpe")
    with pytest.raises(ValueError, match=r"cannot tell which tokenizer '.*vocab.txt' is from its name; pass kind="):
        dl.Tokenize(str(tmp_path / "vocab.txt"))
    with pytest.raises(ValueError, match=r"add_bos=True but the sentencepiece tokenizer '.*sp_nobos.model' has no BOS token"):
        dl.Tokenize(files["sentencepiece_nobos"], add_bos=True)
    with pytest.raises(ValueError, match=r"add_bos=True but the tiktoken encoding 'cl100k_base' has no BOS token"):
        dl.Tokenize("cl100k_base", add_bos=True)  # refused before loading (no download)
    with pytest.raises(ValueError, match=r"has no token '<nope>'"):
        dl.Tokenize(files["huggingface"], bos_token="<nope>", add_bos=True)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match=r"'.*bad.json' is not a tokenizers JSON file"):
        dl.Tokenize(str(tmp_path / "bad.json"))


def test_bad_elements_say_what_is_wrong(files):
    op = dl.Tokenize(files["huggingface"])
    with pytest.raises(ValueError, match=r"the element is not UTF-8 text"):
        op.map(b"\xff\xfe")
    with pytest.raises(TypeError, match=r"Tokenize got a dict \(keys \['text'\]\) but no feature; pass feature="):
        op.map({"text": "x"})
    with pytest.raises(TypeError, match=r"the element must be text \(bytes or str\), got int"):
        op.map(3)
    with pytest.raises(KeyError, match=r"Tokenize\(feature='body'\): the element has no such key"):
        dl.Tokenize(files["huggingface"], feature="body").map({"text": "x"})


def test_the_loaded_tokenizer_is_never_pickled(files):
    op = dl.Tokenize(files["sentencepiece"], add_bos=True)
    assert op._backend is not None  # check=True loaded it here
    data = pickle.dumps(op)
    assert len(data) < os.path.getsize(files["sentencepiece"]) / 4
    copy = pickle.loads(data)
    assert copy._backend is None
    assert copy.map(TEXT)["tokens"].tolist() == op.map(TEXT)["tokens"].tolist()
    assert copy.backend is op.backend  # one load per process, shared


def _process_and_backend(example):
    backend = backends.load("huggingface", example.pop("spec"))
    return {**example, "pid": np.int64(os.getpid()), "backend": np.int64(id(backend)),
            "loaded": np.int64(len(backends._CACHE))}


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_each_worker_loads_the_tokenizer_once_and_output_does_not_depend_on_workers(files):
    texts = [line.encode() for line in tf.corpus(64)]
    spec = files["huggingface"]

    def run(workers):
        loader = dl.DataLoader(
            dl.InMemoryDataSource(texts), dl.IndexSampler(len(texts), num_epochs=1),
            [dl.MapTransform(lambda t: {"text": t, "spec": spec}),
             dl.Tokenize(spec, feature="text", add_bos=True, check=False),
             dl.MapTransform(_process_and_backend), dl.Batch(1)],
            worker_count=workers, warm_start=False)
        return list(loader)

    with_workers, alone = run(2), run(0)
    assert [b["tokens"].tolist() for b in with_workers] == [b["tokens"].tolist() for b in alone]
    pids = {int(b["pid"][0]) for b in with_workers}
    # Which worker takes which unit is up to the scheduler (one may take them all).
    assert 1 <= len(pids) <= 2 and os.getpid() not in pids
    for pid in pids:  # in each worker: one backend object, one tokenizer in the cache
        rows = [b for b in with_workers if int(b["pid"][0]) == pid]
        assert len({int(b["backend"][0]) for b in rows}) == 1
        assert {int(b["loaded"][0]) for b in rows} == {1}
