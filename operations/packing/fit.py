"""First-fit and best-fit packing of variable-length sequences into fixed-length rows.

Both work in rounds, as Grain's do: a round opens ``num_packing_bins`` empty rows; each
element goes into a row where every feature still fits (first-fit: the first such row;
best-fit: the fullest one); the first element that fits nowhere closes the round, whose
rows are handed out (shuffled with ``shuffle_bins``), and opens the next. So a round's
output depends only on the elements between two round starts, which is what lets the
stage resume from the state at the start of the round (a bounded replay).

A sequence longer than its row (which Grain refuses) is cut into pieces of the row's
length, each a segment of its own; a sequence no longer than the row is never cut.
All the per-element work is on whole arrays: choosing the row is a few numpy calls on
a ``(features, bins)`` matrix, placing it one slice assignment per feature.

Example:
    >>> op = FirstFitPack({"tokens": 4}, num_packing_bins=2, shuffle_bins=False)
    >>> packer = op.new_round()
    >>> [packer.add({"tokens": np.array(t)}) for t in ([1, 2], [3, 4, 5], [6])]
    [True, True, True]
    >>> [r["tokens"].tolist() for r in packer.rows()]
    [[1, 2, 6, 0], [3, 4, 5, 0]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from .spec import PackSpec


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


class Piece(NamedTuple):
    """An element (or a piece of one) with its packed features as arrays and their
    lengths, converted once: choosing a row and placing it both read them."""

    element: Any
    arrays: list[np.ndarray]
    lengths: np.ndarray


class FitPack:
    """A first-fit or best-fit packing stage (see the module docstring).

    Args:
        length_struct: feature -> row length, e.g. ``{"inputs": 2048, "targets": 2048}``
            (nested dicts for meta features, see :mod:`.spec`).
        num_packing_bins: rows packed together in one round (more: fuller rows).
        seed: keys the shuffle of a round's rows (as Grain's: ``seed + rows before``).
        shuffle_bins: hand a round's rows out in a random order (else in row order).
        shuffle_bins_group_by_feature: with ``shuffle_bins``, order rows by the mean of
            the distinct non-zero values of this output feature (then by the shuffle).
        meta_features: features packed without segment ids and positions (see spec).
        pack_alignment_struct: feature -> alignment: each element starts at a multiple.
        padding_struct: feature -> the value of padding cells (default 0).
        max_sequences_per_bin: the most elements one row may hold.
    """

    best_fit = False
    runs = "stream"  # on the ordered stream: operations.transforms.STREAM
    stage = "dataloader.engine.stages.packing:FitPackIterator"  # the stage that runs it

    def __init__(
        self,
        length_struct: Any,
        num_packing_bins: int,
        *,
        seed: int = 0,
        shuffle_bins: bool = True,
        shuffle_bins_group_by_feature: str | None = None,
        meta_features: Sequence[str] = (),
        pack_alignment_struct: Any = None,
        padding_struct: Any = None,
        max_sequences_per_bin: int | None = None,
    ) -> None:
        self.spec = PackSpec(length_struct, meta_features, pack_alignment_struct, padding_struct)
        self.num_packing_bins = _positive("num_packing_bins", num_packing_bins)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
            raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
        self.seed = int(seed)
        if not isinstance(shuffle_bins, bool):
            raise TypeError(f"shuffle_bins must be True or False, got {shuffle_bins!r}")
        self.shuffle_bins = shuffle_bins
        group = shuffle_bins_group_by_feature
        if group is not None and not isinstance(group, str):
            raise TypeError(f"shuffle_bins_group_by_feature must be a feature name, got {group!r}")
        self.group_by = group
        self.max_sequences_per_bin = (
            None if max_sequences_per_bin is None
            else _positive("max_sequences_per_bin", max_sequences_per_bin)
        )

    @property
    def name(self) -> str:
        return f"{type(self).__name__}({self.spec.length_struct}, bins={self.num_packing_bins})"

    def __repr__(self) -> str:
        return self.name

    def describe(self) -> dict[str, Any]:
        """What a state of this stage records about it."""
        return {
            "packer": type(self).__name__,
            **self.spec.describe(),
            "num_packing_bins": self.num_packing_bins,
            "seed": self.seed,
            "shuffle_bins": self.shuffle_bins,
            "max_sequences_per_bin": self.max_sequences_per_bin,
        }

    def new_round(self) -> FitRound:
        return FitRound(self)

    def pieces(self, element: Any) -> list[Piece]:
        """The element, or its pieces when a feature is longer than its row."""
        spec = self.spec
        arrays = spec.arrays(element)
        lengths = np.asarray([len(a) for a in arrays], np.int64)
        n = int(np.max(-(-lengths // spec.lengths)))
        if n <= 1:
            return [Piece(element, arrays, lengths)]
        out = []
        caps = spec.lengths.tolist()
        for j in range(n):
            cut = [array[j * cap : (j + 1) * cap] for array, cap in zip(arrays, caps)]
            out.append(Piece(spec.replace(element, cut), cut, np.asarray([len(a) for a in cut], np.int64)))
        return out

    def row_order(self, rows: list[dict[str, Any]], counter: int) -> list[int]:
        """The order a round's rows are handed out in, Grain's: ``counter`` counts the
        rows of earlier rounds, so each round has its own shuffle.

        Grain permutes the round's ``n`` rows with ``default_rng(seed + counter)``, and
        with ``shuffle_bins_group_by_feature`` sorts the rows by (the mean of the
        distinct non-zero values of that feature, the row's entry in that permutation,
        the row), which is what this does, so the rows come out in Grain's order.
        """
        n = len(rows)
        if not self.shuffle_bins:
            return list(range(n))
        shuffled = np.random.default_rng(self.seed + counter).permuted(np.arange(n))
        if self.group_by is None:
            return shuffled.tolist()

        def group_mean(row: dict[str, Any]) -> float:
            if self.group_by not in row:
                raise KeyError(
                    f"shuffle_bins_group_by_feature={self.group_by!r} is not a feature of the "
                    f"packed rows ({sorted(row)})"
                )
            distinct = np.unique(np.asarray(row[self.group_by]))
            nonzero = np.count_nonzero(distinct)
            return float(distinct.sum() / nonzero) if nonzero else 0.0

        keys = [(group_mean(rows[r]), int(shuffled[r]), r) for r in range(n)]
        return [r for *_, r in sorted(keys)]


class FirstFitPack(FitPack):
    """First-fit packing: each element goes into the first row where it fits."""

    config_key = "first_fit_pack"  # its key in a YAML config's operations


class BestFitPack(FitPack):
    """Best-fit packing: each element goes into the fullest row where it fits."""

    config_key = "best_fit_pack"  # its key in a YAML config's operations

    best_fit = True


class FitRound:
    """The rows of one round, filled element by element.

    Attributes:
        last_row: the row the last piece added went into (-1 before the first).
    """

    def __init__(self, op: FitPack) -> None:
        self._op, self._spec = op, op.spec
        self._bins = op.num_packing_bins
        self._values: list[np.ndarray] | None = None
        self._segments: list[np.ndarray] = []
        self._positions: list[np.ndarray] = []
        self._used = np.zeros((len(self._spec.names), self._bins), np.int64)
        self._count = np.zeros(self._bins, np.int64)
        self._side: list[dict[str, list[Any]]] = [{} for _ in range(self._bins)]
        self._capacity = self._spec.lengths[:, None]
        self.last_row = -1

    @property
    def empty(self) -> bool:
        return not self._count.any()

    def pieces(self, element: Any) -> list[Piece]:
        """The element, or its pieces when a feature is longer than its row."""
        return self._op.pieces(element)

    def add(self, piece: Piece | Any) -> bool:
        """Puts a piece (from :meth:`pieces`, or an element no feature of which is longer
        than its row) into a row; False if none fits."""
        spec = self._spec
        if not isinstance(piece, Piece):
            arrays = spec.arrays(piece)
            piece = Piece(piece, arrays, np.asarray([len(a) for a in arrays], np.int64))
        lengths = piece.lengths
        if (lengths > spec.lengths).any():
            raise ValueError(f"a piece longer than its row reached the packer: {lengths} > {spec.lengths}")
        fits = (self._used + lengths[:, None] <= self._capacity).all(axis=0)
        if self._op.max_sequences_per_bin is not None:
            fits &= self._count < self._op.max_sequences_per_bin
        if not fits.any():
            return False
        if self._op.best_fit:
            fullness = np.where(fits, self._used.sum(axis=0), -1)
            row = int(np.argmax(fullness))
        else:
            row = int(np.argmax(fits))
        self._place(piece.element, piece.arrays, lengths, row)
        return True

    def _place(self, element: Any, arrays: list[np.ndarray], lengths: np.ndarray, row: int) -> None:
        spec = self._spec
        if self._values is None:
            self._values, self._segments, self._positions = spec.empty_rows(arrays, self._bins)
        segment = int(self._count[row]) + 1
        for i, array in enumerate(arrays):
            start = int(self._used[i, row])
            stop = start + int(lengths[i])
            self._values[i][row, start:stop] = array
            self._segments[i][row, start:stop] = segment
            self._positions[i][row, start:stop] = np.arange(stop - start, dtype=np.int32)
            align = int(spec.alignments[i])
            self._used[i, row] = -(-stop // align) * align
        self._count[row] += 1
        self.last_row = row
        for key in spec.side_meta:
            if key in element:
                self._side[row].setdefault(key, []).append(element[key])

    def rows(self) -> list[dict[str, Any]]:
        """The rows that hold at least one element, in row order."""
        if self._values is None:
            return []
        used = int(np.count_nonzero(self._count))
        return [
            self._spec.row(self._values, self._segments, self._positions, r, self._side[r])
            for r in range(used)
        ]
