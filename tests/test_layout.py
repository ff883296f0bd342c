"""The package as a whole: its public names, its layering, and what importing it costs."""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys
import textwrap
import types

import pytest

import dataloader as dl
from tests.helpers import REPO_ROOT

ROOT = pathlib.Path(REPO_ROOT)
# Packages with a public API of their own; dl re-exports all of it.
PACKAGES = [
    "dataloader.samplers",
    "dataloader.sources",
    "dataloader.operations",
    "dataloader.dataset",
    "dataloader.device",
    "dataloader.config",
]
# The building blocks: they import numpy and their own modules, never the engine or
# each other (they are installed as dataloader.<name>, so only relative imports).
BLOCKS = ["samplers", "sources", "operations"]
HEAVY = ["jax", "orbax", "yaml", "absl", "pyarrow", "apache_beam"]


def test_all_is_sorted_and_every_name_resolves():
    assert dl.__all__ == sorted(dl.__all__)
    assert len(dl.__all__) == len(set(dl.__all__))
    for name in dl.__all__:
        assert getattr(dl, name) is not None, name
    assert set(dl.__all__) <= set(dir(dl))


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_lists_its_public_names_and_dl_exports_them(package):
    module = importlib.import_module(package)
    assert module.__all__ == sorted(module.__all__)
    defined_here = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and getattr(value, "__module__", "").startswith(package)
    }
    assert defined_here <= set(module.__all__), f"public but not in __all__: {defined_here - set(module.__all__)}"
    for name in module.__all__:
        assert name in dl.__all__, f"{package}.{name} is not exported by dataloader"
        assert getattr(dl, name) is getattr(module, name), name


def test_names_users_know_from_grain_are_there():
    for name in ["DataLoader", "IndexSampler", "ShardOptions", "ShardByJaxProcess", "MapTransform",
                 "RandomMapTransform", "FlatMapTransform", "FilterTransform", "Batch",
                 "ArrayRecordDataSource", "MapDataset", "IterDataset", "ReadOptions",
                 "MultiprocessingOptions", "RecordMetadata", "device_prefetch", "load_config",
                 "ParquetDataSource", "CheckpointSave", "CheckpointRestore"]:
        assert name in dl.__all__ and name in dir(dl), name


def _imports(path: pathlib.Path) -> list[tuple[str, int]]:
    """(module, level) of every import statement in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", node.level))
    return found


@pytest.mark.parametrize("block", BLOCKS)
def test_building_blocks_import_neither_the_engine_nor_each_other(block):
    others = {"dataloader", *BLOCKS, "configs"}
    for path in sorted((ROOT / block).rglob("*.py")):
        depth = len(path.relative_to(ROOT / block).parts)  # sources/remote/x.py may use '..'
        for module, level in _imports(path):
            assert level <= depth, f"{path}: 'from {'.' * level}{module}' leaves the package"
            if level == 0:
                assert module.split(".")[0] not in others, f"{path} imports {module}"


def test_the_engine_never_imports_the_dataset_api():
    """The placement rule of dataloader/engine/stages/__init__.py: a stage the dataset API
    alone builds lives in dataloader/dataset/, and the engine never reaches up to it."""
    for path in sorted((ROOT / "dataloader" / "engine").rglob("*.py")):
        for module, _ in _imports(path):
            assert not module.startswith("dataloader.dataset"), f"{path} imports {module}"


def test_the_engine_never_imports_jax():
    for path in sorted((ROOT / "dataloader" / "engine").rglob("*.py")):
        for module, _ in _imports(path):
            assert module.split(".")[0] != "jax", f"{path} imports {module}"


def test_the_device_feed_never_imports_the_front_door():
    # It reads any DatasetIterator by what it declares (engine/stages/base.py), so the
    # loader and its iterator stay above it.
    front_door = {"dataloader", "dataloader.iterator", "dataloader.loader"}
    paths = sorted((ROOT / "dataloader" / "device").rglob("*.py"))
    assert paths
    for path in paths:
        for module, level in _imports(path):
            assert level < 2 or module.split(".")[0] not in {"iterator", "loader"}, f"{path} imports ..{module}"
            assert module not in front_door, f"{path} imports {module}"


@pytest.mark.parametrize(("room", "upstairs"), [
    ("engine", ("dataloader.dataset", "dataloader.device", "dataloader.config", "dataloader.cli",
                "dataloader.beam", "dataloader.loader", "dataloader.iterator")),
    ("beam", ("dataloader.cli",)),
])
def test_rooms_import_only_downwards(room, upstairs):
    # The engine is what the front door, the dataset API and the device feed are built
    # on; conversion (beam) is what the command line drives.
    paths = sorted((ROOT / "dataloader" / room).rglob("*.py"))
    assert paths
    for path in paths:
        for module, _ in _imports(path):
            assert not module.startswith(upstairs), f"{path} imports {module}"


def test_only_the_beam_room_imports_apache_beam():
    beam_room = ROOT / "dataloader" / "beam"
    roots = [ROOT / name for name in ("dataloader", *BLOCKS, "configs")]
    for path in sorted(p for root in roots for p in root.rglob("*.py")):
        if beam_room in path.parents:
            continue
        for module, _ in _imports(path):
            assert module.split(".")[0] != "apache_beam", f"{path} imports {module}"
            assert not module.startswith("dataloader.beam") or path.parent.name == "cli", f"{path} imports {module}"


def test_the_converter_without_beam_plans_and_names_shards_with_no_beam_loaded():
    # dataloader.cli.convert shares the pipeline's planning (dataloader.beam.plan), which
    # must stay importable where Beam is not installed.
    code = "import sys, dataloader.cli.convert, dataloader.beam.plan; print('apache_beam' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    assert out.stdout.strip() == "False"


def test_no_package_folder_holds_more_than_twelve_modules():
    # Not the benchmarks' environments either (benchmarks/.venv, .venv-mosaic: setup_env.sh).
    folders = [
        p for p in ROOT.rglob("__init__.py")
        if not any(part.startswith(".venv") for part in p.parts) and "tests" not in p.parts
    ]
    assert folders
    for init in folders:
        modules = list(init.parent.glob("*.py"))
        assert len(modules) <= 12, f"{init.parent} holds {len(modules)} modules"


def test_an_in_process_loader_imports_no_heavy_library():
    code = textwrap.dedent(
        f"""
        import sys
        import numpy as np
        import dataloader as dl
        loader = dl.DataLoader(
            dl.InMemoryDataSource([np.full(3, i) for i in range(50)]),
            dl.IndexSampler(50, shuffle=True, seed=1, num_epochs=1),
            [dl.MapTransform(lambda x: x * 2), dl.FilterTransform(lambda x: x[0] % 3),
             dl.Batch(8)])
        it = iter(loader)
        assert sum(len(b) for b in it) == 33
        state = it.get_state()
        loader.iterator(state)
        ds = dl.MapDataset.range(10).seed(1).shuffle().map(lambda x: x + 1).batch(2)
        assert len(list(ds)) == 5
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
        print(heavy)
        assert not heavy, heavy
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
