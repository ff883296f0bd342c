"""Pipeline configs: loading, overrides, errors that name the key, building the loader."""

from __future__ import annotations

import os

import numpy as np
import pytest
import yaml

import dataloader as dl
from dataloader.config.import_path import ImportPathError, resolve_import
from dataloader.config.overrides import apply_overrides
from dataloader.config.pipeline import ConfigError, load_config, parse_config
from dataloader.demo.data import synthetic_digits, write_digits
from dataloader.sources import write_array_record
from tests.helpers import REPO_ROOT, assert_streams_equal

CONFIGS = os.path.join(REPO_ROOT, "configs")


def base() -> dict:
    return {
        "source": {"kind": "dataloader.sources.RangeDataSource", "options": {"start": 20}},
        "sampler": {"shuffle": True, "seed": 3, "num_epochs": 1},
        "operations": [{"map": "numpy.square"}, {"batch": {"batch_size": 4}}],
    }


def double(x, factor=2):
    return x * factor


class Halve(dl.MapTransform):
    def map(self, element):
        return element // 2


def not_an_operation():
    return 42


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> dict:
    images, labels = synthetic_digits(120)
    return write_digits(tmp_path_factory.mktemp("digits"), images, labels, test_size=20, num_shards=2)


def write_yaml(tmp_path, data: dict) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


# --- the shipped configs -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "paths_key", "batch_size"),
    [("demo.yaml", "train", 64), ("array_record_images.yaml", "train", 128), ("parquet.yaml", "parquet", 100)],
)
def test_shipped_configs_build_a_loader_that_yields_image_batches(digits, name, paths_key, batch_size):
    paths = digits[paths_key]
    override = f"source.paths={paths if isinstance(paths, str) else os.path.dirname(paths[0]) + '/*.array_record'}"
    config = load_config(os.path.join(CONFIGS, name), [override, "loader.worker_count=0", "device.enabled=false"])
    it = config.build_iterator()
    batch = next(it)
    assert batch["image"].shape == (batch_size, 8, 8) and batch["image"].dtype == np.float32
    assert batch["label"].shape == (batch_size,)


# --- building ------------------------------------------------------------------------


def test_built_loader_equals_the_loader_written_by_hand():
    config = parse_config(base())
    by_hand = dl.DataLoader(
        dl.RangeDataSource(20),
        dl.IndexSampler(20, shuffle=True, seed=3, num_epochs=1),
        [dl.MapTransform(np.square), dl.Batch(4)],
    )
    assert_streams_equal(list(config.build_loader()), list(by_hand))


def test_function_args_are_bound_as_keywords():
    data = base()
    data["operations"][0] = {"map": f"{__name__}.double", "args": {"factor": 10}}
    first = next(iter(parse_config(data, ["sampler.shuffle=false"]).build_loader()))
    assert first.tolist() == [0, 10, 20, 30]


def test_a_config_is_code_loading_runs_the_modules_it_names_and_an_override_names_any_callable(tmp_path, monkeypatch):
    """What docs/configs-and-cli.md's "a config is code" warns of: load_config imports (runs) the
    modules it names, and an override may put any callable in place of an operation."""
    (tmp_path / "side_effects.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('ran').write_text('imported')\n"
        "def shout(x):\n    return -x\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = load_config(write_yaml(tmp_path, base()), ["operations.0.map=side_effects.shout", "sampler.shuffle=false"])
    assert (tmp_path / "ran").read_text() == "imported"  # before any loader was built
    assert next(iter(config.build_loader())).tolist() == [0, -1, -2, -3]


def test_an_operation_subclass_is_instantiated():
    data = base()
    data["operations"][0] = {"map": f"{__name__}.Halve"}
    config = parse_config(data, ["sampler.shuffle=false"])
    assert isinstance(config.operations[0], Halve)
    assert next(iter(config.build_loader())).tolist() == [0, 0, 1, 1]


def test_explicit_sharding_becomes_shard_options():
    config = parse_config(base(), ["sampler.sharding={shard_index: 1, shard_count: 2}"])
    assert config.build_loader().sampler.shard_options == dl.ShardOptions(1, 2)


def test_device_enabled_puts_the_iterator_behind_the_device_queue():
    config = parse_config(base(), ["device.enabled=true", "device.device_buffer_size=1"])
    with config.build_iterator() as it:
        assert isinstance(it, dl.DeviceIterator)
        assert np.asarray(next(it)).shape == (4,)


# --- overrides -----------------------------------------------------------------------


def test_override_values_are_read_as_yaml():
    config = parse_config(base(), ["sampler.seed=7", "sampler.num_epochs=null", "loader.warm_start=false"])
    assert (config.sampler.seed, config.sampler.num_epochs, config.loader.warm_start) == (7, None, False)


def test_override_indexes_lists_by_number():
    config = parse_config(base(), ["operations.1.batch.batch_size=5"])
    assert config.operations[1].batch_size == 5


def test_overrides_do_not_change_the_input():
    data = base()
    apply_overrides(data, ["sampler.seed=9"])
    assert data["sampler"]["seed"] == 3


def test_malformed_override_is_an_error():
    with pytest.raises(ConfigError, match=r"override 'sampler\.seed' is not of the form key\.sub=value"):
        parse_config(base(), ["sampler.seed"])


def test_override_of_a_list_index_out_of_range_is_an_error():
    with pytest.raises(ConfigError, match=r"operations\.5 is not an index of the list operations \(it has 2 items\)"):
        parse_config(base(), ["operations.5.map=numpy.abs"])


# --- errors at load time, naming the key ---------------------------------------------


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match=r"^sampler\.seed: expected an integer \(or null\), got 'abc'$"):
        parse_config(base(), ["sampler.seed=abc"])


def test_device_buffer_size_below_one_names_the_key():
    with pytest.raises(ConfigError, match=r"^device\.device_buffer_size: .*1.*got 0"):
        parse_config(base(), ["device.device_buffer_size=0"])


def test_stall_warning_and_unit_timeout_reach_the_loader():
    config = parse_config(base(), ["loader.worker_count=1", "loader.stall_warning_s=5", "loader.unit_timeout_s=30"])
    assert (config.loader.stall_warning_s, config.loader.unit_timeout_s) == (5.0, 30.0)
    loader = config.build_loader()
    assert (loader.stall_warning_s, loader.unit_timeout_s) == (5.0, 30.0)
    default = parse_config(base())
    assert (default.loader.stall_warning_s, default.loader.unit_timeout_s) == (60.0, None)
    assert parse_config(base(), ["loader.stall_warning_s=null"]).build_loader().stall_warning_s is None


@pytest.mark.parametrize(("override", "message"), [
    ("loader.stall_warning_s=soon", r"^loader\.stall_warning_s: expected a number, got 'soon'$"),
    ("loader.stall_warning_s=0", r"^loader\.stall_warning_s: expected a number > 0, got 0"),
    ("loader.unit_timeout_s=true", r"^loader\.unit_timeout_s: expected a number, got True$"),
    ("loader.unit_timeout_s=10", r"^loader\.unit_timeout_s: needs loader\.worker_count > 0"),
])
def test_bad_stall_settings_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(base(), [override])


def test_worker_count_auto_and_its_tuning_reach_the_loader():
    config = parse_config(base(), ["loader.worker_count=auto", "loader.auto_workers.max_workers=3"])
    assert config.loader.worker_count == dl.AutoWorkers(max_workers=3)
    assert config.build_loader().worker_count == dl.AutoWorkers(max_workers=3)
    assert parse_config(base(), ["loader.worker_count=auto"]).loader.worker_count == dl.AutoWorkers()


@pytest.mark.parametrize(("override", "message"), [
    (["loader.worker_count=many"], r"^loader\.worker_count: expected an integer >= 0 or auto, got 'many'$"),
    (["loader.auto_workers.max_workers=3"], r"^loader\.auto_workers: needs loader\.worker_count: auto$"),
    (["loader.worker_count=auto", "loader.auto_workers.most=3"],
     r"^loader\.auto_workers\.most: unknown key; expected one of min_workers, max_workers, "),
    (["loader.worker_count=auto", "loader.auto_workers.min_workers=0"],
     r"^loader\.auto_workers: AutoWorkers\.min_workers must be an integer >= 1, got 0$"),
])
def test_bad_auto_workers_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(base(), override)


def test_unknown_key_names_the_key_and_the_known_ones():
    with pytest.raises(ConfigError, match=r"^loader\.workers: unknown key; expected one of worker_count, "):
        parse_config(base(), ["loader.workers=2"])


def test_missing_file_names_the_key(tmp_path):
    data = {"source": {"kind": "array_record", "paths": str(tmp_path / "nothing-*.array_record")}}
    with pytest.raises(ConfigError, match=r"^source\.paths: glob pattern '.*nothing-\*\.array_record' matches no file"):
        parse_config(data)


def test_missing_one_of_several_files_names_its_index(tmp_path, digits):
    data = {"source": {"kind": "array_record", "paths": [digits["train"][0], str(tmp_path / "gone.ar")]}}
    with pytest.raises(ConfigError, match=r"^source\.paths\.1: ArrayRecord file '.*gone\.ar' does not exist"):
        parse_config(data)


def test_a_directory_as_source_paths_names_the_key_at_load_time(tmp_path):
    data = {"source": {"kind": "array_record", "paths": str(tmp_path)}}
    with pytest.raises(ConfigError, match=r"^source\.paths: '.*' is a directory, expected an ArrayRecord file; pass a glob"):
        parse_config(data)


def test_a_recursive_glob_in_source_paths_is_accepted(tmp_path):
    # Only a recursive glob matches: one file at the top, one two levels down.
    for sub, count in ((".", 2), ("a/b", 3)):
        (tmp_path / sub).mkdir(parents=True, exist_ok=True)
        write_array_record(tmp_path / sub / "x.array_record", [b"r"] * count)
    data = {"source": {"kind": "array_record", "paths": str(tmp_path / "**" / "x.array_record")}}
    assert len(parse_config(data).build_source()) == 5


def test_operation_that_does_not_import_names_the_entry():
    with pytest.raises(ConfigError, match=r"^operations\.0\.map: cannot import 'nopkg\.fn': No module named 'nopkg'"):
        parse_config(base(), ["operations.0.map=nopkg.fn"])


def test_operation_that_is_not_callable_names_the_entry():
    with pytest.raises(ConfigError, match=r"^operations\.0\.map: numpy\.pi is a float, not a function or a MapTransform"):
        parse_config(base(), ["operations.0.map=numpy.pi"])


def test_operation_of_another_kind_is_refused():
    with pytest.raises(ConfigError, match=r"^operations\.0\.filter: .*Halve is a MapTransform, not a FilterTransform"):
        parse_config(base(), [f"operations.0={{filter: {__name__}.Halve}}"])


def test_arguments_the_function_does_not_take_are_refused():
    data = base()
    data["operations"][0] = {"map": f"{__name__}.double", "args": {"scale": 3}}
    with pytest.raises(ConfigError, match=r"^operations\.0\.args: .*double cannot be called .*'scale'"):
        parse_config(data)


def test_operation_factory_must_return_an_operation():
    with pytest.raises(ConfigError, match=r"^operations\.0\.operation: .*not_an_operation\(\*\*args\) returned a int"):
        parse_config(base(), [f"operations.0={{operation: {__name__}.not_an_operation}}"])


def test_shuffle_without_a_seed_is_refused():
    with pytest.raises(ConfigError, match=r"^sampler\.seed: sampler\.shuffle is true, so an integer seed is needed"):
        parse_config(base(), ["sampler.seed=null"])


def test_unknown_source_option_names_the_key():
    with pytest.raises(ConfigError, match=r"^source\.options: dataloader\.sources\.RangeDataSource does not take these options"):
        parse_config(base(), ["source.options.begin=3"])


def test_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"config file '.*absent\.yaml' does not exist"):
        load_config(tmp_path / "absent.yaml")


def test_invalid_yaml_is_an_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("source: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not valid YAML"):
        load_config(path)


def test_load_config_reads_yaml_and_applies_overrides(tmp_path):
    config = load_config(write_yaml(tmp_path, base()), ["operations.1.batch.batch_size=10"])
    assert [b.shape for b in config.build_loader()] == [(10,), (10,)]


# --- import paths --------------------------------------------------------------------


def test_import_paths_accept_a_colon_or_dots():
    assert resolve_import("os.path:join") is resolve_import("os.path.join") is os.path.join


def test_import_path_with_a_missing_attribute_names_it():
    with pytest.raises(ImportPathError, match=r"'os\.path' has no attribute 'nope'"):
        resolve_import("os.path.nope")


def tokens_of(i):
    """Record i as a token sequence of 1 + i % 7 tokens (for the packer configs)."""
    return {"tokens": np.arange(1 + int(i) % 7, dtype=np.int32) + 100 * int(i)}


def test_a_config_packs_with_the_same_packers_as_the_data_loader():
    config = parse_config({
        "source": {"kind": "dataloader.sources.RangeDataSource", "options": {"start": 40}},
        "operations": [
            {"map": "tests.dataloader.config.test_config.tokens_of"},
            {"first_fit_pack": {"length_struct": {"tokens": 16}, "num_packing_bins": 3, "seed": 1}},
            {"batch": 2},
        ],
    })
    by_hand = dl.DataLoader(dl.RangeDataSource(40), dl.IndexSampler(40, num_epochs=1), [
        dl.MapTransform(tokens_of), dl.FirstFitPack({"tokens": 16}, 3, seed=1), dl.Batch(2)])
    assert_streams_equal(list(config.build_loader()), list(by_hand))


def test_a_packer_in_a_config_names_its_bad_argument():
    with pytest.raises(ConfigError, match=r"^operations\.0\.concat_then_split\.bos_handling: expected one of DO_NOTHING, REPLACE_FIRST_TOKEN_WITH_BOS, INSERT_BOS, got 'FIRST'"):
        parse_config({"source": {"kind": "dataloader.sources.RangeDataSource", "options": {"start": 4}},
                      "operations": [{"concat_then_split": {"length_struct": {"t": 4}, "bos_handling": "FIRST"}}]})
    with pytest.raises(ConfigError, match=r"^operations\.0\.best_fit_pack: best_fit_pack\(\*\*args\) failed: num_packing_bins must be a positive integer"):
        parse_config({"source": {"kind": "dataloader.sources.RangeDataSource", "options": {"start": 4}},
                      "operations": [{"best_fit_pack": {"length_struct": {"t": 4}, "num_packing_bins": -1}}]})


def test_loader_worker_kind_reaches_the_loader_and_a_bad_one_names_the_key():
    loader = parse_config(base(), ["loader.worker_count=2", "loader.worker_kind=threads"]).build_loader()
    assert loader.worker_kind == "threads"
    with pytest.raises(ConfigError, match=r"^loader\.worker_kind: expected processes, threads or auto, got 'fibers'"):
        parse_config(base(), ["loader.worker_kind=fibers"])
