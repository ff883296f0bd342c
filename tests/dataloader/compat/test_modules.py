"""The alias's table: every Grain path hangs under another, every name resolves or says why."""

from __future__ import annotations

import types

import pytest

from dataloader.compat.alias import _resolves, resolve
from dataloader.compat.modules import MODULES, submodules


def test_every_module_path_hangs_under_one_in_the_table():
    for name in MODULES:
        if name != "grain":
            parent, _, child = name.rpartition(".")
            assert parent in MODULES and child in submodules(parent), name


def test_submodules_are_the_direct_children_only():
    assert submodules("grain._src.python.dataset.sources") == ["parquet_dataset", "tfrecord_dataset"]
    assert "sources" not in submodules("grain._src.python")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_grain_name_is_a_granary_object_or_a_clear_refusal(module):
    for name in MODULES[module].names:
        if not _resolves(module, name):
            with pytest.raises(AttributeError, match=rf"granary does not provide Grain's {module}\.{name}:"):
                resolve(module, name)
            continue
        value = resolve(module, name)
        assert not isinstance(value, types.ModuleType), f"{module}.{name}"
        assert getattr(value, "__module__", "dataloader").startswith("dataloader") or value is list


def test_renamed_names_take_granarys_spelling():
    import dataloader as dl

    assert resolve("grain.python", "PyGrainDatasetIterator") is dl.DataLoaderIterator
    assert resolve("grain._src.core.transforms", "RandomMap") is dl.RandomMapTransform


def test_names_left_out_on_purpose_say_why_and_what_to_use():
    from dataloader.compat.modules import DIFFERENCES

    seen = set()
    for module, entry in MODULES.items():
        for name in set(entry.names) & set(DIFFERENCES):
            seen.add(name)
            why, instead = DIFFERENCES[name]
            with pytest.raises(AttributeError) as info:
                resolve(module, name)
            message = str(info.value)
            assert message.startswith(f"granary does not provide Grain's {module}.{name}: {why}. Use {instead}")
            assert message.endswith("(see docs/grain-differences.md (Differences from Grain))")
    assert seen == set(DIFFERENCES)  # each is a name of Grain's modules
