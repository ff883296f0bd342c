"""Tests of record metadata and per-record random generators (samplers/metadata.py)."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

from dataloader.samplers import RecordMetadata, record_rng


def _draws(rng: np.random.Generator, size: int = 8) -> list[int]:
    return rng.integers(0, 2**63, size=size).tolist()


def test_same_arguments_give_the_same_draws() -> None:
    assert _draws(record_rng(3, 17, stream=2, sub_index=1)) == _draws(
        record_rng(3, 17, stream=2, sub_index=1)
    )


def test_golden_draws_for_seed_42() -> None:
    """Pins the generator: changing it changes every random augmentation."""
    assert record_rng(42, 7).integers(0, 1000, 5).tolist() == [166, 588, 324, 895, 198]


@pytest.mark.parametrize(
    "other",
    [
        {"seed": 4, "global_position": 17, "stream": 0, "sub_index": 0},
        {"seed": 3, "global_position": 18, "stream": 0, "sub_index": 0},
        {"seed": 3, "global_position": 17, "stream": 1, "sub_index": 0},
        {"seed": 3, "global_position": 17, "stream": 0, "sub_index": 1},
    ],
)
def test_changing_any_argument_changes_the_draws(other: dict[str, int]) -> None:
    assert _draws(record_rng(3, 17)) != _draws(record_rng(**other))


def test_a_record_stream_does_not_run_into_its_neighbour() -> None:
    long_run = set(record_rng(1, 5).integers(0, 2**63, size=100_000).tolist())
    assert not long_run & set(_draws(record_rng(1, 6)))


def test_neighbouring_positions_are_uncorrelated() -> None:
    firsts = np.array([record_rng(9, g).random() for g in range(3000)])
    assert abs(np.corrcoef(firsts[:-1], firsts[1:])[0, 1]) < 0.1
    assert abs(firsts.mean() - 0.5) < 0.03


def test_next_position_is_unrelated_to_next_seed() -> None:
    a = np.array([record_rng(s, 1).random() for s in range(2000)])
    b = np.array([record_rng(s + 1, 0).random() for s in range(2000)])
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.1
    assert not np.any(a == b)


def test_a_generator_without_seed_is_refused() -> None:
    with pytest.raises(
        ValueError,
        match=r"per-record random generators need a seed; pass seed=\.\.\. to the sampler",
    ):
        record_rng(None, 0)


def test_a_negative_position_is_refused() -> None:
    with pytest.raises(ValueError, match=r"global_position must be in \[0, 2\*\*64\), got -1"):
        record_rng(0, -1)


def test_a_stream_that_is_not_an_int_is_refused() -> None:
    with pytest.raises(TypeError, match=r"stream must be an int, got 1\.5 of type float"):
        record_rng(0, 0, stream=1.5)  # type: ignore[arg-type]


def test_a_bool_seed_is_refused() -> None:
    with pytest.raises(TypeError, match="seed must be an int, got True of type bool"):
        record_rng(True, 0)


def test_metadata_rng_is_the_record_rng_of_its_global_position() -> None:
    meta = RecordMetadata(index=2, record_key=9, epoch=1, global_position=12, seed=5)
    assert _draws(meta.rng) == _draws(record_rng(5, 12))


def test_metadata_has_grains_fields_and_positional_order() -> None:
    rng = np.random.default_rng(3)
    meta = RecordMetadata(7, 9, rng)
    assert (meta.index, meta.record_key, meta.rng) == (7, 9, rng)
    assert RecordMetadata(1).record_key is None and RecordMetadata(1).rng is None


def test_metadata_without_seed_has_no_rng() -> None:
    meta = RecordMetadata(index=0, record_key=0, epoch=0, global_position=0, seed=None)
    assert meta.rng is None


def test_metadata_is_frozen_and_slotted() -> None:
    meta = RecordMetadata(index=0, record_key=0, epoch=0, global_position=0, seed=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        meta.index = 1  # type: ignore[misc]
    assert not hasattr(meta, "__dict__")


def test_metadata_survives_pickling() -> None:
    meta = RecordMetadata(index=3, record_key=4, epoch=5, global_position=6, seed=7)
    assert pickle.loads(pickle.dumps(meta)) == meta


def test_rng_factory_draws_exactly_what_record_rng_draws() -> None:
    from dataloader.samplers import RecordRngFactory

    rngs = RecordRngFactory(seed=5, stream=3)
    for position, sub in [(0, 0), (7, 2), (2**40, 0), (7, 2)]:
        fresh = record_rng(5, position, 3, sub)
        reused = rngs(position, sub)
        assert reused.random(4).tolist() == fresh.random(4).tolist()
        assert reused.integers(0, 2**31, size=3, dtype=np.uint32).tolist() == fresh.integers(
            0, 2**31, size=3, dtype=np.uint32
        ).tolist()
        assert reused.normal(size=2).tolist() == fresh.normal(size=2).tolist()


def test_rng_factory_resets_a_generator_left_mid_stream() -> None:
    from dataloader.samplers import RecordRngFactory

    rngs = RecordRngFactory(seed=5)
    rngs(1).integers(0, 10, dtype=np.uint32)  # leaves half a 64-bit word cached
    assert rngs(1).random() == record_rng(5, 1).random()


def test_rng_factory_needs_a_seed() -> None:
    from dataloader.samplers import RecordRngFactory

    with pytest.raises(ValueError, match=r"need a seed; pass seed="):
        RecordRngFactory(None)
