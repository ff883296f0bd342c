"""The MaxText config reader: MaxText's keys build the pipeline; bad keys are named."""

from __future__ import annotations

import shutil

import pytest

import dataloader as dl
from dataloader.maxtext import load_maxtext_config, parse_maxtext_config
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
    ({"grain_file_type": "csv"}, r"grain_file_type: expected one of arrayrecord, parquet, tfrecord, got 'csv'"),
    ({"grain_packing_type": "greedy"}, r"grain_packing_type: expected one of first_fit, best_fit, concat_then_split"),
    ({"max_target_length": "2k"}, r"max_target_length: expected an integer, got '2k'"),
    ({"grain_worker_count": -2}, r"grain_worker_count: expected an integer >= 0, got -2"),
    ({"tokenizer_path": ""}, r"tokenizer_path: missing; this key is required"),
    ({"per_device_batch_size": 0}, r"per_device_batch_size: expected a number > 0, got 0"),
    ({"train_data_columns": ["a", "b"]}, r"train_data_columns: expected a list of one column name"),
    ({"dataset_type": "tfds"}, r"dataset_type: expected grain .*, got 'tfds'; set dataset_type=grain"),
    ({"use_sft": True}, r"use_sft: true, but granary builds MaxText's pre-training pipeline only"),
    ({"grain_index_storage_option": "disk"}, r"grain_index_storage_option: expected one of in_memory, offloaded, got 'disk'"),
    ({"grain_shuffle_buffer_size": 0}, r"grain_shuffle_buffer_size: expected an integer >= 1, got 0"),
    ({"grain_num_threads": -1}, r"grain_num_threads: expected an integer >= 0, got -1"),
    ({"grain_ram_budget_mb": "1G"}, r"grain_ram_budget_mb: expected an integer, got '1G'"),
    ({"grain_use_elastic_iterator": True}, r"grain_use_elastic_iterator: true needs packing: false"),
    ({"grain_use_elastic_iterator": True, "packing": False, "grain_file_type": "tfrecord"},
     r"grain_use_elastic_iterator: true needs records read by index .* got grain_file_type 'tfrecord'"),
    ({"grain_use_elastic_iterator": True, "packing": False, "grain_train_files": "a*,1;b*,2"},
     r"grain_use_elastic_iterator: true reads one file pattern; a mixture"),
    ({"expansion_factor_real_data": "x"}, r"expansion_factor_real_data: expected a number, got 'x'"),
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
    with pytest.raises(dl.ConfigError, match=r"grain_use_elastic_itrator: unknown key; did you mean grain_use_elastic_iterator"):
        parse_maxtext_config({**base_keys, "grain_use_elastic_itrator": True}, ignore_unknown=True)


def test_a_batch_that_is_not_whole_is_refused(base_keys):
    config = parse_maxtext_config({**base_keys, "per_device_batch_size": 0.5})
    with pytest.raises(dl.ConfigError, match=r"per_device_batch_size: 0.5 per device times 1 devices is 0.5"):
        config.global_batch_size(device_count=1)


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


# The keys MaxText's base.yml sets for its Grain pipeline, with base.yml's values
# (MaxText commit e591f30c), plus two of its other keys, as a MaxText user's file has them.
MAXTEXT_BASE_YML = """
dataset_type: tfds
tokenizer_path: ""
tokenizer_type: "sentencepiece"
tokenize_train_data: true
tokenize_eval_data: true
add_bos: true
add_eos: true
use_truncation: true
per_device_batch_size: 12.0
expansion_factor_real_data: -1.0
eval_per_device_batch_size: 0.0
train_data_columns: ['text']
eval_data_columns: ['text']
packing: true
num_epoch: 1
generate_padding_batch_train: false
generate_padding_batch_eval: false
max_segments_per_seq: -1
use_dpo: false
use_sft: false
grain_train_files: ''
grain_eval_files: ''
grain_train_mixture_config_path: ''
grain_file_type: 'arrayrecord'
grain_packing_type: 'first_fit'
grain_worker_count: 1
grain_per_worker_buffer_size: 1
grain_num_threads: 16
grain_prefetch_buffer_size: 500
grain_worker_count_eval: 1
grain_per_worker_buffer_size_eval: 1
grain_ram_budget_mb: 1024
grain_num_threads_eval: 16
grain_prefetch_buffer_size_eval: 500
grain_data_source_max_workers: 16
grain_index_storage_option: null
grain_shuffle_buffer_size: 100
grain_use_elastic_iterator: false
colocated_python_data_input: false
max_target_length: 2048
enable_data_shuffling: true
data_shuffle_seed: 0
steps: 150_001
base_emb_dim: 2048
"""


def test_a_whole_maxtext_base_yml_reads_with_maxtexts_grain_overrides(tmp_path):
    (tmp_path / "base.yml").write_text(MAXTEXT_BASE_YML)
    config = load_maxtext_config(tmp_path / "base.yml", [
        "dataset_type=grain", "grain_train_files=/data/c4-*.array_record", "tokenizer_path=/tok.model"],
        ignore_unknown=True)
    assert (config.train_files, config.train_mixture, config.eval_files) == ("/data/c4-*.array_record", None, None)
    assert (config.file_type, config.record_format, config.packing_type) == ("arrayrecord", "text", "first_fit")
    assert (config.worker_count, config.per_worker_buffer_size, config.ram_budget_mb) == (1, 1, 1024)
    assert (config.num_threads, config.prefetch_buffer_size, config.num_threads_eval,
            config.prefetch_buffer_size_eval) == (16, 500, 16, 500)
    assert (config.data_source_max_workers, config.index_storage_option, config.shuffle_buffer_size,
            config.use_elastic_iterator) == (16, None, 100, False)
    assert (config.max_target_length, config.max_segments_per_seq, config.seed) == (2048, None, 0)
    assert config.other == {"steps": 150001, "base_emb_dim": 2048}
    with pytest.raises(dl.ConfigError, match=r"dataset_type: expected grain"):
        load_maxtext_config(tmp_path / "base.yml", ignore_unknown=True)  # base.yml's tfds


def test_tfrecord_files_hold_tf_examples_unless_told(base_keys):
    assert parse_maxtext_config({**base_keys, "grain_file_type": "tfrecord"}).record_format == "tf_example"
    assert parse_maxtext_config({**base_keys, "grain_file_type": "tfrecord", "record_format": "text"}).record_format == "text"
    assert parse_maxtext_config({**base_keys, "grain_file_type": "parquet"}).record_format == "text"


def test_keys_without_an_equivalent_are_accepted_and_logged(base_keys, caplog):
    caplog.set_level("INFO", logger="absl")  # absl.app, run by other tests, may have raised its level
    config = parse_maxtext_config({**base_keys, "colocated_python_data_input": True,
                                   "expansion_factor_real_data": 2.0, "generate_padding_batch_train": True,
                                   "generate_padding_batch_eval": True})
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("granary: ")]
    assert len(logged) == 3
    assert "colocated_python_data_input=True is accepted; data is loaded in each training process" in logged[1]
    assert "expansion_factor_real_data=2.0 is accepted; every process loads its own share" in logged[2]
    assert "generate_padding_batch_train=True is accepted; the training stream ends" in logged[0]
    assert config.train_files == base_keys["grain_train_files"]
    caplog.clear()
    parse_maxtext_config(base_keys)  # MaxText's defaults ask for nothing granary lacks
    assert not [r for r in caplog.records if r.getMessage().startswith("granary: ")]
