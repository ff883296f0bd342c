"""Concat-then-split packing: the stream's sequences end to end, cut into rows.

Elements go into the current row in stream order; the element that does not fit is
split (each packed feature at the cells its row has left) and its rest opens the next
row. No token is dropped. As in Grain, a row is complete only when an element does not
fit in it whole (a full row still takes an element whose features that are full are
empty), and meta features in ``length_struct`` are never split: one that does not fit
completes the row, and every piece of a split element carries the element's meta
features whole.

``split_full_length_features=False`` passes an element one of whose features (meta
features included) exactly fills its row, none being longer, through as a row of its
own, as Grain does: such rows come out right after the row being filled when they
arrived, so they are handed out a little later than their place in the stream.

BOS handling. Every segment of the ``bos_features`` starts with ``bos_token_id``, in one
of two ways. ``BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS`` is Grain's: the segment's first
cell is overwritten with BOS, so where that token was not BOS (the continuation of a
split sequence, a sequence tokenised without BOS) it is lost. ``BOSHandling.INSERT_BOS``
(granary's) puts a BOS *before* such a token instead, so no token is lost and the
segment is one cell longer.

Example:
    >>> op = ConcatThenSplit({"tokens": 4})
    >>> row = op.new_row()
    >>> row.add({"tokens": np.array([1, 2, 3])}, None), row.add({"tokens": np.array([4, 5, 6])}, None)
    (None, {'tokens': 1})
    >>> r = row.finish(); r["tokens"].tolist(), r["tokens_segment_ids"].tolist()
    ([1, 2, 3, 4], [1, 1, 1, 2])
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from .spec import PackSpec


class BOSHandling(enum.Enum):
    """How a packer treats beginning-of-sequence tokens (see the module docstring).

    ``DO_NOTHING`` and ``REPLACE_FIRST_TOKEN_WITH_BOS`` are Grain's names and meanings;
    ``INSERT_BOS`` is granary's, which loses no token.
    """

    DO_NOTHING = enum.auto()
    REPLACE_FIRST_TOKEN_WITH_BOS = enum.auto()
    INSERT_BOS = enum.auto()


# How a segment gets its BOS: not at all, overwriting its first cell, or before it.
_NO_BOS, _REPLACE, _INSERT = 0, 1, 2


class ConcatThenSplit:
    """Concat-then-split packing (see the module docstring).

    Args:
        length_struct: feature -> row length (a flat dict).
        meta_features: features packed without segment ids and positions, never split.
        split_full_length_features: split an element whose feature is exactly a row long
            like any other (default), or pass it through as a row of its own.
        bos_handling: ``BOSHandling.DO_NOTHING``, ``REPLACE_FIRST_TOKEN_WITH_BOS`` (Grain's:
            overwrite each segment's first token) or ``INSERT_BOS`` (put BOS before it).
        bos_features: the features whose segments start with BOS.
        bos_token_id: the BOS token, needed unless ``DO_NOTHING``.
    """

    runs = "stream"  # on the ordered stream: operations.transforms.STREAM
    stage = "dataloader.engine.stages.packing:ConcatIterator"  # the stage that runs it
    config_key = "concat_then_split"  # its key in a YAML config's operations

    def __init__(
        self,
        length_struct: Mapping[str, int],
        *,
        meta_features: Collection[str] = (),
        split_full_length_features: bool = True,
        bos_handling: BOSHandling = BOSHandling.DO_NOTHING,
        bos_features: Collection[str] = (),
        bos_token_id: int | None = None,
    ) -> None:
        self.spec = PackSpec(length_struct, tuple(meta_features))
        if self.spec.nested:
            raise ValueError(
                f"ConcatThenSplit packs flat dicts of sequences, as Grain's does; length_struct "
                f"{self.spec.length_struct} nests: flatten those features first (a map)"
            )
        unpacked = [k for k in self.spec.meta if k not in self.spec.names]
        if unpacked:
            raise ValueError(
                f"ConcatThenSplit packs every feature it keeps; meta_features {unpacked} are "
                f"not in length_struct {list(self.spec.names)}"
            )
        if not self.spec.packed:
            raise ValueError(
                f"ConcatThenSplit needs a sequence to split, but every feature of length_struct "
                f"{self.spec.length_struct} is in meta_features {sorted(self.spec.meta)}: leave "
                f"the token feature(s) out of meta_features"
            )
        if not isinstance(split_full_length_features, bool):
            raise TypeError(f"split_full_length_features must be True or False, got {split_full_length_features!r}")
        self.split_full_length_features = split_full_length_features
        if not isinstance(bos_handling, BOSHandling):
            raise TypeError(f"bos_handling must be a BOSHandling, got {bos_handling!r}")
        bos_features = tuple(bos_features)
        if bos_handling is BOSHandling.DO_NOTHING and (bos_features or bos_token_id is not None):
            raise ValueError(
                "bos_handling=BOSHandling.DO_NOTHING adds no BOS, so leave bos_features and "
                "bos_token_id unset (or use REPLACE_FIRST_TOKEN_WITH_BOS or INSERT_BOS)"
            )
        if bos_handling is not BOSHandling.DO_NOTHING:
            if isinstance(bos_token_id, bool) or not isinstance(bos_token_id, (int, np.integer)):
                raise ValueError(f"bos_handling={bos_handling} needs an integer bos_token_id, got {bos_token_id!r}")
            bad = [k for k in bos_features if k not in self.spec.packed]
            if bad:
                raise ValueError(f"bos_features {bad} must be packed features of length_struct (not meta)")
        self.bos_handling = bos_handling
        self.bos_features = bos_features
        self.bos_token_id = None if bos_token_id is None else int(bos_token_id)
        self._inserts = bos_handling is BOSHandling.INSERT_BOS

    @property
    def name(self) -> str:
        return f"ConcatThenSplit({self.spec.length_struct})"

    def __repr__(self) -> str:
        return self.name

    def describe(self) -> dict[str, Any]:
        return {
            "packer": "ConcatThenSplit",
            **self.spec.describe(),
            "split_full_length_features": self.split_full_length_features,
            "bos": [self.bos_handling.name, list(self.bos_features), self.bos_token_id],
        }

    def check_features(self, element: Any) -> None:
        """Refuses an element with a feature ``length_struct`` gives no length (Grain's
        check): the rows would silently leave it out."""
        if isinstance(element, Mapping):
            extra = [key for key in element if key not in self.spec.length_struct]
            if extra:
                raise ValueError(
                    f"the element has features {sorted(map(str, extra))} that length_struct "
                    f"{self.spec.length_struct} gives no row length; ConcatThenSplit packs every "
                    f"feature of an element, as Grain's does: give each a length (a per-sequence "
                    f"value as a meta feature), or drop it with a map before packing"
                )

    def bos_mode(self, key: str, piece: np.ndarray) -> int:
        """How the segment ``piece`` of feature ``key`` gets its BOS (none for an empty
        piece; none to insert where it starts with BOS already)."""
        if key not in self.bos_features or len(piece) == 0:
            return _NO_BOS
        if not self._inserts:
            return _REPLACE
        return _NO_BOS if piece[0] == self.bos_token_id else _INSERT

    def new_row(self) -> ConcatRow:
        return ConcatRow(self)

    def passes_through(self, element: Any) -> bool:
        """Whether a fresh element is a row of its own (``split_full_length_features=False``):
        a feature, meta or not, fills its row exactly (with the BOS it would get), none
        is longer, as Grain decides."""
        if self.split_full_length_features:
            return False
        self.check_features(element)
        full = False
        for key, array, cap in zip(self.spec.names, self.spec.arrays(element), self.spec.lengths.tolist()):
            n = len(array) + int(self.bos_mode(key, array) == _INSERT)
            if n > cap:
                return False
            full = full or n == cap
        return full

    def single_row(self, element: Any) -> dict[str, Any]:
        """The row of an element that :meth:`passes_through`."""
        row = self.new_row()
        rest = row.add(element, None)
        assert rest is None, "single_row() of an element that does not fit one row"
        return row.finish()


class ConcatRow:
    """One row being filled; :meth:`add` puts in what fits and says what is left."""

    def __init__(self, op: ConcatThenSplit) -> None:
        self._op, self._spec = op, op.spec
        self._values: list[np.ndarray] | None = None
        self._segments: list[np.ndarray] = []
        self._positions: list[np.ndarray] = []
        self._used = [0] * len(self._spec.names)
        self._count = 0

    @property
    def empty(self) -> bool:
        return self._count == 0

    def add(self, element: Any, offsets: dict[str, int] | None) -> dict[str, int] | None:
        """Puts the element (from ``offsets`` on, per feature) into this row.

        Returns ``None`` when all of it went in (the row may take more), else the
        offsets where its rest starts (the row is then complete: finish it). An element
        that fits nowhere in this non-empty row comes back whole (offsets all 0 or as
        given) and completes the row.
        """
        spec = self._spec
        if offsets is None:
            self._op.check_features(element)
        arrays = spec.arrays(element)
        # a meta feature is never split: each piece of the element carries it whole
        starts = [0 if offsets is None or meta else int(offsets.get(k, 0))
                  for k, meta in zip(spec.names, spec.is_meta)]
        whole = {k: s for k, s in zip(spec.names, starts)}
        parts, rest = [], False
        for i, (key, array, cap) in enumerate(zip(spec.names, arrays, spec.lengths.tolist())):
            piece = array[starts[i]:]
            left = cap - self._used[i]
            if key in spec.meta:
                if len(piece) > left:
                    if self.empty:
                        raise ValueError(
                            f"meta feature {key!r} has {len(piece)} values but rows hold "
                            f"{cap}; meta features are never split, so raise its length"
                        )
                    return whole  # never split: it goes whole into the next row
                parts.append((piece, _NO_BOS))
                continue
            bos = self._op.bos_mode(key, piece)
            take = min(len(piece), max(left - int(bos == _INSERT), 0))
            rest = rest or take < len(piece)
            parts.append((piece[:take], bos if take > 0 else _NO_BOS))
        packed = [i for i, meta in enumerate(spec.is_meta) if not meta]
        if not any(len(parts[i][0]) for i in packed) and any(len(arrays[i]) > starts[i] for i in packed):
            if self.empty:
                raise ValueError(f"rows of {spec.length_struct} cannot hold a BOS and a token")
            return whole  # nothing fits here any more
        self._place(element, arrays, parts)
        if rest:
            return {k: 0 if meta else s + len(p)
                    for k, meta, s, (p, _) in zip(spec.names, spec.is_meta, starts, parts)}
        return None

    @property
    def full(self) -> bool:
        """A packed feature has no cell left."""
        return any(
            self._used[i] >= cap for i, cap in enumerate(self._spec.lengths.tolist())
            if self._spec.names[i] not in self._spec.meta
        )

    def _place(self, element: Any, arrays: list[np.ndarray], parts: list[tuple[np.ndarray, int]]) -> None:
        spec = self._spec
        if self._values is None:
            self._values, self._segments, self._positions = spec.empty_rows(arrays, 1)
        self._count += 1
        for i, (piece, bos) in enumerate(parts):
            start = self._used[i]
            values = self._values[i][0]
            stop = start + int(bos == _INSERT) + len(piece)
            values[stop - len(piece) : stop] = piece
            if bos != _NO_BOS:
                values[start] = self._op.bos_token_id
            if stop > start:
                self._segments[i][0, start:stop] = self._count
                self._positions[i][0, start:stop] = np.arange(stop - start, dtype=np.int32)
            self._used[i] = stop

    def finish(self) -> dict[str, Any]:
        """The row as an output element (padding where nothing was put)."""
        assert self._values is not None, "finish() on a row that holds nothing"
        return self._spec.row(self._values, self._segments, self._positions, 0)
