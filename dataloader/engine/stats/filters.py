"""Grain's filter thresholds: warn or fail when filters drop too many records."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from dataloader.operations.transforms import KEEP, MANY

logger = logging.getLogger("dataloader")


class FilterWatch:
    """Grain's filter thresholds: the share of records the filters dropped, checked on
    consecutive windows of ``WINDOW`` records read (from where the stream started;
    :meth:`add_unit` cuts units at the windows' edges, so the windows do not depend on
    how the stream was cut into units).

    As Grain does: a window whose share reaches ``fail`` raises ``ValueError``, one that
    reaches ``warn`` logs a warning (logger ``"dataloader"``, at most once a minute), and
    the messages read ``Transformation ... skipped 100.00 % of the last seen 1000 elements``.

    Args:
        warn, fail: the ratios at or above which to warn or raise; None: never.
        where: names the pipeline's filters in the messages.
    """

    WINDOW = 1000
    WARN_EVERY_S = 60.0  # Grain's interval between two warnings

    def __init__(self, warn: float | None, fail: float | None, where: str) -> None:
        self._warn, self._fail, self._where = warn, fail, where
        self._read = self._dropped = 0
        self._warned_at: float | None = None

    @classmethod
    def for_operations(cls, ops: Sequence[Any], options: Any) -> FilterWatch | None:
        """A watch over ``ops`` with ``options`` (a ``DatasetOptions``), or None: no filter,
        no threshold, or a flat map (which adds elements, so drops cannot be counted)."""
        filters = [op.name for op in ops if op.returns == KEEP]
        if not filters or any(op.returns == MANY for op in ops):
            return None
        warn = options.get("filter_warn_threshold_ratio")
        fail = options.get("filter_raise_threshold_ratio")
        if warn is None and fail is None:
            return None
        return cls(warn, fail, ", ".join(filters))

    def add_unit(self, start: int, stop: int, kept: np.ndarray) -> None:
        """Counts the records at positions ``[start, stop)``, of which those at the sorted
        positions ``kept`` survived the filters, window by window."""
        while start < stop:
            cut = min(stop, start + self.WINDOW - self._read)
            survived = int(np.searchsorted(kept, cut) - np.searchsorted(kept, start))
            self.add(cut - start, cut - start - survived)
            start = cut

    def add(self, read: int, dropped: int) -> None:
        self._read += read
        self._dropped += dropped
        if self._read < self.WINDOW:
            return
        ratio, read = self._dropped / self._read, self._read
        self._read = self._dropped = 0
        what = f"Transformation {self._where} skipped {ratio * 100:.2f} % of the last seen {read} elements"
        if self._fail is not None and ratio >= self._fail:
            raise ValueError(
                f"{what}, at or above filter_raise_threshold_ratio={self._fail}. Check the "
                f"filters, pre-filter the data, or set the threshold to None "
                f"(DatasetOptions in WithOptionsIterDataset)"
            )
        if self._warn is not None and ratio >= self._warn:
            now = time.monotonic()
            if self._warned_at is None or now - self._warned_at >= self.WARN_EVERY_S:
                self._warned_at = now
                logger.warning(
                    "%s, at or above filter_warn_threshold_ratio=%s. Check the filters, or set "
                    "the threshold to None (DatasetOptions in WithOptionsIterDataset)",
                    what, self._warn,
                )
