"""``import grain`` gives granary once the alias is installed, and only then."""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dataloader as dl
from dataloader.compat import (
    ENV_VAR,
    GrainAliasModule,
    install_grain_alias,
    is_installed,
    uninstall_grain_alias,
)
from tests.helpers import assert_streams_equal

# The import statements of MaxText's src/ and torchtitan's torchtitan/components/data/,
# and the forms Grain's documentation uses: each must run unchanged.
IMPORT_FORMS = [
    "import grain",
    "import grain.python as grain",
    "import grain.python",
    "from grain import python",
    "from grain import experimental",
    "from grain import experimental as grain_experimental",
    "from grain.experimental import ElasticIterator",
    "from grain.experimental import TFRecordIterDataset",
    "from grain.experimental import ElasticIterator, TFRecordIterDataset, BestFitPackIterDataset",
    "from grain import checkpoint, constants, multiprocessing, samplers, sharding, sources, transforms",
    "import grain.python.experimental",
    "from grain._src.python.dataset.sources.tfrecord_dataset import _TFRecordReader, _TFRecordDatasetIterator",
    "from grain._src.python.dataset.dataset import MapDataset, IterDataset, DatasetIterator",
    "from grain._src.core.sharding import ShardOptions",
    "from grain.sharding import *",
]
# Every name MaxText's src/ and torchtitan read from Grain (an AST scan of their
# `grain.<...>` uses), but grain.python.MapOperation (MaxText's RL pipeline), which
# granary does not have.
USED_NAMES = [
    "grain.DataLoader", "grain.MapDataset", "grain.IterDataset", "grain.DatasetIterator",
    "grain.ReadOptions", "grain.MultiprocessingOptions", "grain.RecordMetadata",
    "grain.python.MapTransform", "grain.python.MapDataset", "grain.python.IterDataset",
    "grain.python.DataLoader", "grain.python.DatasetIterator", "grain.python.ReadOptions",
    "grain.python.ShardOptions", "grain.python.IndexSampler", "grain.python.Batch",
    "grain.python.RecordMetadata", "grain.python.MultiprocessingOptions",
    "grain.python.ArrayRecordDataSource", "grain.python.RandomMapTransform",
    "grain.python.RandomAccessDataSource", "grain.python.PyGrainCheckpointHandler",
    "grain.experimental.ElasticIterator", "grain.experimental.ParquetIterDataset",
    "grain.experimental.InterleaveIterDataset", "grain.experimental.batch_and_pad",
    "grain.experimental.ConcatThenSplitIterDataset", "grain.experimental.WindowShuffleIterDataset",
    "grain.experimental.PackAndBatchOperation", "grain.experimental.FlatMapTransform",
    "grain.experimental.FirstFitPackIterDataset", "grain.experimental.BestFitPackIterDataset",
    "grain.experimental.BOSHandling", "grain.experimental.TFRecordIterDataset",
    "grain.experimental.pick_performance_config",
    "grain.transforms.Map", "grain.transforms.Batch", "grain.sources.RandomAccessDataSource",
    "grain.sharding.ShardOptions",
]


def _lookup(path: str):
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def _run(code: str, cwd, env_var: str | None = None, pythonpath: str | None = None):
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, "PYTHONPATH")}
    if env_var is not None:
        env[ENV_VAR] = env_var
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("statement", IMPORT_FORMS)
def test_every_import_form_of_grain_code_runs(alias, statement):
    namespace: dict = {}
    exec(statement, namespace)
    bound = {k: v for k, v in namespace.items() if k != "__builtins__"}
    assert bound, statement
    for value in bound.values():
        # a module of the alias, or an object of granary's
        assert isinstance(value, GrainAliasModule) or value.__module__.startswith("dataloader."), value


@pytest.mark.parametrize("path", USED_NAMES)
def test_each_grain_name_maxtext_and_torchtitan_use_is_granarys(alias, path):
    assert _lookup(path).__module__.startswith("dataloader.")


def test_grain_names_are_granarys_objects_themselves(alias):
    import grain
    import grain.python

    assert grain.python.MapDataset is dl.MapDataset
    assert grain.MapDataset is dl.MapDataset
    assert grain.python.experimental.ElasticIterator is dl.experimental.ElasticIterator
    assert grain.transforms.Map is dl.MapTransform
    assert grain.python.FilterTransform is dl.FilterTransform
    assert grain.python.PyGrainDatasetIterator is dl.DataLoaderIterator
    assert grain.sharding.ShardOptions is dl.ShardOptions
    assert grain.sources.SharedMemoryDataSource is dl.SharedMemoryDataSource


def test_a_grain_pipeline_written_against_grain_python_gives_granarys_output(alias):
    import grain.python as grain

    ds = grain.MapDataset.range(10).seed(3).shuffle().map(lambda x: x * 2).batch(4)
    reference = dl.MapDataset.range(10).seed(3).shuffle().map(lambda x: x * 2).batch(4)
    assert_streams_equal(list(ds), list(reference))


def test_a_name_grain_has_and_granary_lacks_says_so_by_attribute_and_by_import(alias):
    import grain.python

    message = (r"granary does not provide Grain's grain\.python\.SharedMemoryArray: Grain's numpy subclass .*"
               r"Use nothing: return plain numpy arrays \(see docs/grain-differences\.md \(Differences from Grain\)\)")
    with pytest.raises(AttributeError, match=message):
        grain.python.SharedMemoryArray  # noqa: B018 - the lookup is the test
    with pytest.raises(ImportError, match=message):
        exec("from grain.python import SharedMemoryArray", {})
    with pytest.raises(AttributeError, match=r"granary does not provide Grain's grain\.constants\.RECORD_KEY"):
        importlib.import_module("grain.constants").RECORD_KEY  # noqa: B018


def test_a_name_neither_grain_nor_granary_has_is_called_a_misspelling(alias):
    import grain.python

    with pytest.raises(AttributeError, match=r"grain\.python\.MapDatset is neither a name of Grain's"):
        grain.python.MapDatset  # noqa: B018
    with pytest.raises(ImportError, match=r"grain\.experimental\.ElasticIterater is neither"):
        exec("from grain.experimental import ElasticIterater", {})
    with pytest.raises(ImportError, match=r"grain\.pythn is neither"):
        importlib.import_module("grain.pythn")


def test_a_name_granary_adds_later_appears_through_the_alias(alias, monkeypatch):
    import grain.python

    with pytest.raises(AttributeError, match="does not provide"):
        grain.python.SharedMemoryArray  # noqa: B018
    stand_in = type("SharedMemoryArray", (), {})
    monkeypatch.setattr(dl, "SharedMemoryArray", stand_in, raising=False)
    assert grain.python.SharedMemoryArray is stand_in


def test_dir_lists_grains_names_and_star_import_takes_those_that_resolve(alias):
    import grain.python

    assert {"MapDataset", "PyGrainDatasetIterator", "SharedMemoryArray", "experimental"} <= set(dir(grain.python))
    names = grain.python.__all__
    assert "MapDataset" in names and "SharedMemoryArray" not in names
    namespace: dict = {}
    exec("from grain.python import *", namespace)
    assert namespace["MapDataset"] is dl.MapDataset and "SharedMemoryArray" not in namespace


def test_install_sets_the_variable_children_inherit_and_uninstall_takes_it_back(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    install_grain_alias()
    install_grain_alias()  # idempotent
    try:
        assert is_installed() and os.environ[ENV_VAR] == "1"
        assert sum(isinstance(f, type(sys.meta_path[0])) for f in sys.meta_path) == 1
        importlib.import_module("grain.python")
    finally:
        uninstall_grain_alias()
    assert ENV_VAR not in os.environ and "grain.python" not in sys.modules
    with pytest.raises(ModuleNotFoundError, match="No module named 'grain'"):
        importlib.import_module("grain")


def test_the_alias_modules_import_nothing_of_granary_until_a_name_is_used(tmp_path):
    out = _run("""
        import sys
        from dataloader.compat import install_grain_alias
        install_grain_alias()
        import grain, grain.python, grain.experimental, grain.checkpoint
        print(sorted(m for m in sys.modules if m.startswith(("dataloader.dataset", "jax", "orbax"))))
        grain.python.MapDataset
        print("dataloader.dataset" in sys.modules)
        """, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "True"]


def _fake_grain(tmp_path):
    package = tmp_path / "site" / "grain"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("REAL = True\n")
    return str(tmp_path / "site")


def test_a_real_grain_is_not_shadowed_unless_forced(tmp_path):
    out = _run("""
        import grain
        from dataloader.compat import RealGrainError, install_grain_alias, uninstall_grain_alias
        try:
            install_grain_alias()
        except RealGrainError as exc:
            print("refused:", "a real Grain is installed" in str(exc), "force=True" in str(exc))
        import grain
        print(grain.REAL)
        install_grain_alias(force=True)
        import grain.python
        print(type(grain.python).__name__, "REAL" in dir(sys.modules["grain"]))
        uninstall_grain_alias()
        import grain
        print(grain.REAL)
        """.replace("import grain\n", "import sys, grain\n", 1), tmp_path, pythonpath=_fake_grain(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["refused: True True", "True", "GrainAliasModule False", "True"]


def test_a_folder_named_grain_without_init_is_not_taken_for_grain(tmp_path):
    (tmp_path / "grain").mkdir()  # a data folder in the working directory
    out = _run("""
        from dataloader.compat import install_grain_alias
        install_grain_alias()
        import grain.python
        print(type(grain.python).__name__)
        """, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "GrainAliasModule"


def test_the_variable_installs_the_alias_at_import_dataloader_lightly(tmp_path):
    out = _run("""
        import sys
        import dataloader as dl
        import grain.python as grain
        print(grain.MapDataset is dl.MapDataset)
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "orbax", "yaml", "pyarrow")))
        """, tmp_path, env_var="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["True", "[]"]


def test_the_variable_warns_and_keeps_a_real_grain_unless_it_says_force(tmp_path):
    code = "import dataloader, grain; print(hasattr(grain, 'REAL'))"
    site = _fake_grain(tmp_path)
    kept = _run(code, tmp_path, env_var="1", pythonpath=site)
    assert kept.returncode == 0, kept.stderr
    assert kept.stdout.strip() == "True"
    assert "RuntimeWarning: GRANARY_GRAIN_ALIAS=1 is ignored: a real Grain is installed" in kept.stderr
    forced = _run(code, tmp_path, env_var="force", pythonpath=site)
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.strip() == "False"


@pytest.mark.parametrize(("value", "installed"), [("0", False), ("", False), ("1", True)])
def test_the_variable_off_leaves_grain_alone(tmp_path, value, installed):
    out = _run("import dataloader.compat as c; print(c.is_installed())", tmp_path, env_var=value)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(installed)


def test_a_bad_value_of_the_variable_is_refused_naming_it(tmp_path):
    out = _run("import dataloader", tmp_path, env_var="yes")
    assert out.returncode != 0
    assert "GRANARY_GRAIN_ALIAS='yes' is not a setting of the grain alias; expected 1" in out.stderr


USER_MODULE = '''
import os
import pickle
import grain.python as grain

with open(os.environ["IMPORTED_BY"], "a") as f:  # which processes imported this module
    f.write(f"{os.getpid()}\\n")


class Scale(grain.MapTransform):
    def map(self, x):
        return x * 3 + 1
'''


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_workers_and_the_fork_server_import_grain_code_through_the_alias(alias, tmp_path, monkeypatch):
    """A pipeline whose operation lives in a module that says `import grain.python as
    grain`: the workers import that module, so the alias must hold in them."""
    (tmp_path / "grain_user_ops.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("IMPORTED_BY", str(tmp_path / "imported_by.txt"))
    ops = importlib.import_module("grain_user_ops")

    def batches(worker_count):
        loader = dl.DataLoader(
            data_source=dl.InMemoryDataSource([np.arange(3) + i for i in range(40)]),
            sampler=dl.IndexSampler(40, shuffle=True, seed=5, num_epochs=1),
            operations=[ops.Scale(), dl.Batch(4)], worker_count=worker_count, warm_start=False)
        with iter(loader) as it:
            return list(it)

    try:
        expected = batches(0)
        got = batches(2)
    finally:
        sys.modules.pop("grain_user_ops", None)
    assert len(expected) == 10
    assert_streams_equal(got, expected)
    importers = {int(p) for p in (tmp_path / "imported_by.txt").read_text().split()}
    assert importers - {os.getpid()}, "no worker imported the module: the test proves nothing"


def test_alias_modules_pickle_by_name_alone_and_in_a_function(alias):
    import cloudpickle
    import grain.python

    assert pickle.loads(pickle.dumps(grain.python)) is grain.python
    uses_grain = eval("lambda: grain.python.MapDataset", {"grain": sys.modules["grain"]})
    payload = cloudpickle.dumps(uses_grain)
    assert len(payload) < 2000  # the module travels as its name, not its contents
    assert pickle.loads(payload)() is dl.MapDataset
