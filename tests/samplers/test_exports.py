"""The package's public names, and what importing it drags in."""

from __future__ import annotations

import subprocess
import sys

from dataloader import samplers


def test_all_lists_the_public_names_sorted() -> None:
    assert samplers.__all__ == sorted(samplers.__all__)
    assert set(samplers.__all__) == {
        "IndexSampler",
        "NoSharding",
        "RecordMetadata",
        "RecordRngFactory",
        "SequentialSampler",
        "ShardByJaxProcess",
        "ShardOptions",
        "permute",
        "record_rng",
    }
    for name in samplers.__all__:
        assert getattr(samplers, name).__module__.startswith("dataloader.samplers.")


def test_importing_samplers_loads_neither_jax_nor_sibling_packages() -> None:
    code = (
        "import sys, dataloader.samplers\n"
        "bad = [m for m in ('jax', 'dataloader.engine', 'dataloader.sources', 'dataloader.operations') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
