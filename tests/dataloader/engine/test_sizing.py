"""Units sized by what they cost: the policy, fed with injected costs (no clock read)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from dataloader.engine.sizing import (
    UNIT_BYTES,
    UNIT_SECONDS,
    Units,
    UnitSizer,
    element_bytes,
    result_bytes,
    sized_ranges,
)

MB = 2**20


def sizes(sizer: UnitSizer, n: int, seconds: float = 0.0, nbytes: float = 0.0) -> list[int]:
    """The next ``n`` sizes, each unit observed as finished at the given per-position costs."""
    out = []
    for _ in range(n):
        size = sizer.next_size()
        out.append(size)
        sizer.observe(size, seconds * size, nbytes * size)
    return out


def test_the_first_unit_is_one_position_whatever_the_cap():
    assert UnitSizer(cap=2048).next_size() == 1


def test_units_stay_at_one_position_until_a_unit_has_finished():
    sizer = UnitSizer(cap=2048)
    assert [sizer.next_size() for _ in range(5)] == [1, 1, 1, 1, 1]


def test_cheap_small_elements_grow_by_doubling_to_the_cap():
    sizer = UnitSizer(cap=2048)
    got = sizes(sizer, 14, seconds=1e-6, nbytes=28)
    assert got == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 2048, 2048]


def test_eight_megabyte_elements_stop_at_the_memory_bound():
    got = sizes(UnitSizer(cap=2048), 6, seconds=1e-4, nbytes=8 * MB)
    assert got == [1, 2, 2, 2, 2, 2]
    assert got[-1] * 8 * MB <= UNIT_BYTES


def test_slow_elements_stop_at_the_time_bound():
    got = sizes(UnitSizer(cap=2048), 8, seconds=0.004, nbytes=100)
    assert got[-1] == int(UNIT_SECONDS / 0.004) == 12
    assert got[:4] == [1, 2, 4, 8]


def test_elements_slower_than_a_unit_should_take_stay_one_position_each():
    assert sizes(UnitSizer(cap=2048), 4, seconds=1.0) == [1, 1, 1, 1]


def test_units_shrink_at_once_when_elements_get_expensive():
    sizer = UnitSizer(cap=2048)
    sizes(sizer, 12, seconds=1e-6)
    assert sizer.next_size() == 2048
    # One unit of 2048 positions took 10 s: the running cost jumps half way there.
    sizer.observe(2048, 10.0, 0)
    assert sizer.next_size() == max(1, int(UNIT_SECONDS / (0.5 * 10.0 / 2048)))


def test_targets_and_cap_are_parameters():
    # 500 bytes at 10 bytes a position: 50, below the cap of 100.
    got = sizes(UnitSizer(cap=100, seconds=1.0, nbytes=500), 10, seconds=1e-6, nbytes=10)
    assert got == [1, 2, 4, 8, 16, 32, 50, 50, 50, 50]
    sizer = UnitSizer(cap=100, seconds=1.0, nbytes=10**9)
    assert max(sizes(sizer, 12, seconds=1e-6)) == 100


def test_an_empty_unit_teaches_nothing():
    sizer = UnitSizer()
    sizer.observe(0, 5.0, 5.0)
    assert sizer.desired() == 1
    sizer.observe(10, 0.0, 0.0)  # free elements: only the cap bounds them
    assert sizer.desired() == sizer.cap


def test_a_cap_below_one_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"UnitSizer cap must be >= 1 position, got 0"):
        UnitSizer(cap=0)


class FixedSizes(UnitSizer):
    """Sizes from a list, then its last one for ever."""

    def __init__(self, seq: list[int]) -> None:
        super().__init__()
        self._seq = itertools.chain(seq, itertools.repeat(seq[-1]))

    def next_size(self) -> int:
        return next(self._seq)


def test_ranges_tile_the_stream_and_small_units_stay_inside_their_grid_block():
    ranges = list(sized_ranges(0, 300, 128, FixedSizes([1, 2, 4, 100, 100, 7])))
    assert ranges[:6] == [(0, 1), (1, 3), (3, 7), (7, 107), (107, 128), (128, 135)]
    assert ranges[0][0] == 0 and ranges[-1][1] == 300
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    for start, stop in ranges:
        assert start // 128 == (stop - 1) // 128  # never crosses a grid line


def test_units_larger_than_the_grid_start_on_it_and_cover_whole_blocks():
    ranges = list(sized_ranges(0, 1000, 128, FixedSizes([1, 300, 300, 1000])))
    # 300 from position 1 finishes the block; 300 from 128 is two whole blocks.
    assert ranges[:4] == [(0, 1), (1, 128), (128, 384), (384, 1000)]


def test_ranges_after_a_restore_mid_block_start_there_and_end_at_the_stream_end():
    ranges = list(sized_ranges(200, 260, 128, FixedSizes([1, 2, 1000])))
    assert ranges == [(200, 201), (201, 203), (203, 256), (256, 260)]


def test_ranges_of_an_endless_stream_go_on():
    ranges = sized_ranges(0, None, 128, FixedSizes([2048]))
    assert list(itertools.islice(ranges, 3)) == [(0, 2048), (2048, 4096), (4096, 6144)]


def test_units_report_finished_results_to_their_sizer():
    sizer = UnitSizer(cap=64)
    units = Units(sized_ranges(0, None, 16, sizer), sizer)
    start, stop = next(units)
    units.observe(SimpleNamespace(start=start, stop=stop, began=1.0, ended=1.0 + 1e-6, outputs=[np.zeros(2)]))
    assert next(units) == (1, 3)


def test_fixed_units_ignore_what_they_hear():
    units = Units(iter([(0, 4)]))
    units.observe(SimpleNamespace(start=0, stop=4, began=0.0, ended=100.0, outputs=[]))
    assert list(units) == [(0, 4)]


def test_element_bytes_counts_arrays_strings_and_containers():
    assert element_bytes(np.zeros((1000, 1000), np.int64)) == 8_000_000
    assert element_bytes({"a": np.zeros(10, np.uint8), "b": b"xyz", "c": "hi"}) == 15
    assert element_bytes([np.zeros(4, np.float32)] * 3) == 48
    # A long list is measured on a sample of three items (alike here: exact).
    assert element_bytes([np.zeros(2, np.uint8)] * 1000) == 2000


def test_result_bytes_measures_three_outputs_and_scales_by_the_count():
    outputs = [np.zeros(10, np.uint8)] * 99 + [np.zeros(1000, np.uint8)]
    # first, middle and last: (10 + 10 + 1000) / 3 per output.
    assert result_bytes(outputs) == pytest.approx(1020 / 3 * 100)
    assert result_bytes([]) == 0.0


def test_unit_outputs_is_what_sixteen_mebibytes_hold_from_one_to_the_cap():
    from dataloader.engine.sizing import MAX_UNIT_POSITIONS, unit_outputs

    assert unit_outputs(2**17) == 128
    assert unit_outputs(8 * MB) == 2
    assert unit_outputs(100 * MB) == 1
    assert unit_outputs(8) == unit_outputs(0) == MAX_UNIT_POSITIONS
