"""The MaxText config reader: MaxText's keys build the pipeline; bad keys are named."""

from __future__ import annotations

import shutil

import pytest

import dataloader as dl
from dataloader.maxtext import load_maxtext_config, mixture_parts, parse_maxtext_config
from tests.helpers import REPO_ROOT


def test_a_good_config_has_maxtexts_defaults(base_keys):
    config = parse_maxtext_config(base_keys)
    assert (config.packing, config.packing_type, config.add_bos, config.add_eos) == (True, "first_fit", True, True)
    assert (config.shuffle, config.seed, config.num_epoch, config.train_column) == (True, 3, 1, "text")
    assert config.global_batch_size(device_count=2) == 8
    assert config.eval_files == base_keys["grain_eval_files"]


def test_overrides_are_maxtexts_key_value(base_keys):
    config = parse_maxtext_config(base_keys, ["packing=false", "max_target_length=64", "num_epoch=null"])
    assert (config.packing, config.max_target_length, config.num_epoch) == (False, 64, None)


def test_maxtexts_minus_one_worker_count_is_auto(base_keys):
    config = parse_maxtext_config({**base_keys, "grain_worker_count": -1, "grain_worker_count_eval": 2})
    assert (config.worker_count, config.worker_count_eval) == ("auto", 2)


@pytest.mark.parametrize(("change", "message"), [
    ({"grain_train_fles": "x"}, r"grain_train_fles: unknown key; did you mean grain_train_files\?"),
    ({"grain_file_type": "tfrecord"}, r"grain_file_type: expected one of arrayrecord, parquet, got 'tfrecord'"),
    ({"grain_packing_type": "greedy"}, r"grain_packing_type: expected one of first_fit, best_fit, concat_then_split"),
    ({"max_target_length": "2k"}, r"max_target_length: expected an integer, got '2k'"),
    ({"grain_worker_count": -2}, r"grain_worker_count: expected an integer >= 0, got -2"),
    ({"tokenizer_path": ""}, r"tokenizer_path: missing; this key is required"),
    ({"per_device_batch_size": 0}, r"per_device_batch_size: expected a number > 0, got 0"),
    ({"train_data_columns": ["a", "b"]}, r"train_data_columns: expected a list of one column name"),
    ({"dataset_type": "tfds"}, r"dataset_type: expected one of grain, got 'tfds'"),
    ({"add_bos": "yes"}, r"add_bos: expected true or false, got 'yes'"),
])
def test_bad_keys_are_named(base_keys, change, message):
    with pytest.raises(dl.ConfigError, match=message):
        parse_maxtext_config({**base_keys, **change})


def test_other_keys_belong_to_the_caller_or_are_ignored_in_a_whole_maxtext_config(base_keys):
    config = parse_maxtext_config({**base_keys, "steps": 10}, other_keys=["steps"])
    assert config.other == {"steps": 10}
    with pytest.raises(dl.ConfigError, match=r"steps: unknown key"):
        parse_maxtext_config({**base_keys, "steps": 10})
    whole = parse_maxtext_config({**base_keys, "base_emb_dim": 2048, "steps": 5}, ignore_unknown=True)
    assert whole.other == {"base_emb_dim": 2048, "steps": 5}
    with pytest.raises(dl.ConfigError, match=r"grain_use_elastic_iterator: unknown key"):
        parse_maxtext_config({**base_keys, "grain_use_elastic_iterator": True}, ignore_unknown=True)


def test_a_batch_that_is_not_whole_is_refused(base_keys):
    config = parse_maxtext_config({**base_keys, "per_device_batch_size": 0.5})
    with pytest.raises(dl.ConfigError, match=r"per_device_batch_size: 0.5 per device times 1 devices is 0.5"):
        config.global_batch_size(device_count=1)


def test_mixtures_in_maxtexts_spelling_and_in_ours():
    assert mixture_parts("a*.array_record") == [("a*.array_record", 1.0)]
    assert mixture_parts("a*.ar,0.3;b*.ar,0.7") == [("a*.ar", 0.3), ("b*.ar", 0.7)]
    assert mixture_parts("gs://x/a*.ar:1;b*.ar:3") == [("gs://x/a*.ar", 0.25), ("b*.ar", 0.75)]


def test_the_yaml_file_in_configs_builds(tmp_path, text_data):
    shutil.copy(f"{REPO_ROOT}/configs/maxtext.yaml", tmp_path / "maxtext.yaml")
    config = load_maxtext_config(tmp_path / "maxtext.yaml", [
        f"grain_train_files={text_data['train']}", f"grain_eval_files={text_data['eval']}",
        f"tokenizer_path={text_data['sentencepiece']}", "max_target_length=32"])
    assert config.tokenizer_type == "sentencepiece" and config.record_format == "text"
    it = iter(dl.maxtext.train_dataset(config, global_batch_size=2))
    batch = next(it)
    it.close()
    assert batch["inputs"].shape == (2, 32)


def test_a_missing_or_broken_yaml_file_is_named(tmp_path):
    with pytest.raises(dl.ConfigError, match=r"config file '.*nothere.yaml' does not exist"):
        load_maxtext_config(tmp_path / "nothere.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(dl.ConfigError, match=r"list.yaml: expected a mapping of MaxText keys"):
        load_maxtext_config(tmp_path / "list.yaml")
