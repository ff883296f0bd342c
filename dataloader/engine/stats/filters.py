"""Grain's filter thresholds: warn or fail when filters drop too many records."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from dataloader.operations import FilterTransform, FlatMapTransform


class FilterWatch:
    """Grain's filter thresholds: the share of records the filters dropped, checked on
    consecutive windows of at least ``WINDOW`` records read.

    Args:
        warn, fail: ratios above which to warn (once per window) or raise; None: never.
        where: names the pipeline's filters in the messages.
    """

    WINDOW = 1000

    def __init__(self, warn: float | None, fail: float | None, where: str) -> None:
        self._warn, self._fail, self._where = warn, fail, where
        self._read = self._dropped = 0

    @classmethod
    def for_operations(cls, ops: Sequence[Any], options: Any) -> FilterWatch | None:
        """A watch over ``ops`` with ``options`` (a ``DatasetOptions``), or None: no filter,
        no threshold, or a flat map (which adds elements, so drops cannot be counted)."""
        filters = [op.name for op in ops if isinstance(op, FilterTransform)]
        if not filters or any(isinstance(op, FlatMapTransform) for op in ops):
            return None
        warn = options.get("filter_warn_threshold_ratio")
        fail = options.get("filter_raise_threshold_ratio")
        if warn is None and fail is None:
            return None
        return cls(warn, fail, ", ".join(filters))

    def add(self, read: int, dropped: int) -> None:
        self._read += read
        self._dropped += dropped
        if self._read < self.WINDOW:
            return
        ratio, read = self._dropped / self._read, self._read
        self._read = self._dropped = 0
        if self._fail is not None and ratio > self._fail:
            raise ValueError(
                f"the filters {self._where} dropped {ratio:.1%} of the last {read} records, "
                f"above filter_raise_threshold_ratio={self._fail}; check the filters or raise "
                f"the threshold (DatasetOptions)"
            )
        if self._warn is not None and ratio > self._warn:
            warnings.warn(
                f"granary: the filters {self._where} dropped {ratio:.1%} of the last {read} "
                f"records (above filter_warn_threshold_ratio={self._warn}; DatasetOptions sets it)",
                UserWarning,
                stacklevel=2,
            )
