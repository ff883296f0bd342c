"""One base for the sampler views (samplers/view.py): every sampler but ``IndexSampler``
reads local positions through a global order, and ``record_keys`` is written once."""

from __future__ import annotations

import ast
import importlib
import pathlib

import numpy as np
import pytest

from dataloader.samplers import IndexSampler, Sampler, ShardOptions
from dataloader.samplers.view import ElementOrder, SamplerView

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_element_order_is_a_sampler_whose_keys_are_its_positions():
    order = ElementOrder()
    assert isinstance(order, Sampler)
    assert order.num_positions is None and order.with_shard_options(ShardOptions(1, 2)) is order
    assert order.record_keys([[3, 4], [0, 9]]).tolist() == [[3, 4], [0, 9]]
    assert order.record_keys(np.arange(3)).dtype == np.int64


class Evens(SamplerView):
    """Local position p is global position 2p of an IndexSampler's order."""

    def __init__(self, base):
        self.base, self.shard_options = base, ShardOptions(0, 1)
        self.take_order_of(base)

    @property
    def num_positions(self):
        return self.base.num_positions // 2

    def global_positions(self, positions):
        return 2 * np.asarray(positions, dtype=np.int64)

    def keys_at(self, global_positions):
        return self.base.record_keys(global_positions)

    def with_shard_options(self, shard_options):
        return self


def test_a_view_reads_its_order_through_global_positions_and_keeps_the_shape():
    base = IndexSampler(10, shuffle=True, seed=3, num_epochs=1)
    view = Evens(base)
    assert isinstance(view, Sampler)
    assert (view.num_records, view.shuffle, view.seed, view.num_epochs) == (10, True, 3, 1)
    assert view.record_keys([[0, 1], [2, 4]]).tolist() == base.record_keys([[0, 2], [4, 8]]).tolist()


def test_a_view_without_keys_at_cannot_be_made():
    class Half(SamplerView):
        num_positions = None

        def global_positions(self, positions):
            return np.asarray(positions)

        def with_shard_options(self, shard_options):
            return self

    with pytest.raises(TypeError, match="keys_at"):
        Half()


def _sampler_classes() -> list[str]:
    """Every class in the four packages that defines ``record_keys`` (a Sampler)."""
    found = []
    for folder in ("dataloader", "samplers", "sources", "operations"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and any(
                        isinstance(f, ast.FunctionDef) and f.name == "record_keys" for f in node.body):
                    found.append(f"{path.relative_to(ROOT).with_suffix('')}:{node.name}".replace("/", "."))
    return found


def test_every_sampler_is_index_sampler_or_a_view():
    """The Sampler protocol itself and IndexSampler (the root order) define record_keys;
    every other sampler gets it from SamplerView (IndexMapSampler adds a fast path over its
    key blocks, and falls back to the view's)."""
    assert _sampler_classes() == ["dataloader.dataset.compile.index_map:IndexMapSampler",
                                  "samplers.index_sampler:IndexSampler", "samplers.protocol:Sampler",
                                  "samplers.view:SamplerView"]
    for module, name in [("dataloader.dataset.compile.index_map", "IndexMapSampler"),
                         ("dataloader.engine.restore.samplers", "ElasticSampler"),
                         ("dataloader.engine.restore.samplers", "StepSampler"),
                         ("dataloader.samplers.view", "ElementOrder")]:
        assert issubclass(getattr(importlib.import_module(module), name), SamplerView), name
