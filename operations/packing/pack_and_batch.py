"""``PackAndBatchOperation``: Grain's pack-and-batch step, on the first-fit packer.

A round opens ``batch_size`` empty rows and packs elements first-fit; the first element
that fits in no row closes the round, which becomes one batch, and opens the next. The
batch is Grain's 3-tuple ``(data, segmentations, positions)``: ``data[f]`` has shape
``(batch_size, length_struct[f], ...)``, and ``segmentations[f]`` / ``positions[f]``
shape ``(batch_size, length_struct[f])``, with segment ids 1, 2, ... per row (0 for
padding) and positions 0, 1, ... within each segment. Rows a round leaves empty are
all padding, as in Grain.

It is a :class:`~.fit.FitPack`, so it runs wherever the packers run: among a
``DataLoader``'s operations (on the ordered stream, the same for every worker count,
restored with one round recomputed) or in ``PackIterDataset``. Unlike Grain's, a
sequence longer than its row is cut into pieces of the row's length (Grain raises),
elements are flat dicts of features (not ``Record`` s), and an empty stream yields no
batch (Grain's fails).

Example:
    >>> import numpy as np
    >>> op = PackAndBatchOperation({"tokens": 4}, batch_size=2)
    >>> packer = op.new_round()
    >>> [packer.add({"tokens": np.array(t)}) for t in ([1, 2], [3, 4, 5], [6], [7, 8])]
    [True, True, True, False]
    >>> data, segmentations, positions = packer.rows()[0]
    >>> data["tokens"].tolist(), segmentations["tokens"].tolist()
    ([[1, 2, 6, 0], [3, 4, 5, 0]], [[1, 1, 2, 0], [1, 1, 1, 0]])
"""

from __future__ import annotations

from typing import Any

from .fit import FirstFitPack, FitRound, _positive


class PackAndBatchOperation(FirstFitPack):
    """Packs sequences first-fit into batches of ``batch_size`` rows (see the module docstring).

    Args:
        length_struct: feature -> row length, e.g. ``{"inputs": 512, "targets": 512}``.
        batch_size: rows per batch (the bins of one round).
        max_sequences_per_bin: the most elements one row may hold.

    Raises:
        TypeError, ValueError: a bad ``length_struct``, or a ``batch_size`` or
            ``max_sequences_per_bin`` that is not a positive integer.
    """

    def __init__(self, length_struct: Any, batch_size: int, max_sequences_per_bin: int | None = None) -> None:
        batch_size = _positive("PackAndBatchOperation batch_size", batch_size)
        super().__init__(
            length_struct, batch_size, shuffle_bins=False, max_sequences_per_bin=max_sequences_per_bin
        )
        self.batch_size = batch_size

    @property
    def name(self) -> str:
        return f"PackAndBatchOperation({self.spec.length_struct}, batch_size={self.batch_size})"

    def new_round(self) -> PackedBatchRound:
        return PackedBatchRound(self)


class PackedBatchRound(FitRound):
    """A first-fit round whose output is the whole batch, in Grain's 3-tuple."""

    def rows(self) -> list[Any]:
        """One item, ``(data, segmentations, positions)``, or none for an empty round."""
        if self._values is None:
            return []
        names = self._spec.names
        data = dict(zip(names, self._values))
        segmentations = dict(zip(names, self._segments))
        positions = dict(zip(names, self._positions))
        return [(data, segmentations, positions)]
