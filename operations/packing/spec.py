"""What a packer packs: features, their row lengths, meta features, alignment and padding.

Elements are flat dicts. Every feature named in ``length_struct`` is a sequence (a numpy
array whose first axis is the sequence; a scalar counts as a sequence of one) packed
into rows of that feature's length. Packed features get ``<f>_segment_ids`` (1, 2, ...
per element in the row, 0 for padding) and ``<f>_positions`` (0, 1, ... within each
segment), as Grain writes them. ``meta_features`` named in ``length_struct`` are packed
the same way but get neither; meta features not in ``length_struct`` are not sequences:
each row lists the values of the elements it holds (an object array).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def _check_struct(name: str, struct: Any, keys: Sequence[str], kind: str) -> dict[str, Any]:
    if struct is None:
        return {}
    if not isinstance(struct, Mapping):
        raise TypeError(f"{name} must be a dict of feature -> {kind}, got {struct!r}")
    unknown = sorted(set(struct) - set(keys))
    if unknown:
        raise ValueError(
            f"{name} names {unknown}, which are not in length_struct {list(keys)}; give "
            f"{kind}s only for the features that are packed"
        )
    return dict(struct)


class PackSpec:
    """The checked description of what is packed (shared by all packers).

    Raises:
        TypeError, ValueError: naming the argument, the value and what is expected.
    """

    def __init__(
        self,
        length_struct: Any,
        meta_features: Sequence[str] = (),
        pack_alignment_struct: Any = None,
        padding_struct: Any = None,
    ) -> None:
        if not isinstance(length_struct, Mapping) or not length_struct:
            raise TypeError(
                f"length_struct must be a non-empty dict of feature -> row length, e.g. "
                f"{{'tokens': 2048}}, got {length_struct!r}"
            )
        for key, length in length_struct.items():
            if not isinstance(key, str):
                raise TypeError(f"length_struct keys must be feature names (str), got {key!r}")
            if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
                raise ValueError(f"length_struct[{key!r}] must be a positive integer, got {length!r}")
        if isinstance(meta_features, str):
            raise TypeError(f"meta_features must be a list of feature names, got the string {meta_features!r}")
        self.names = list(length_struct)
        self.lengths = np.asarray([int(length_struct[k]) for k in self.names], dtype=np.int64)
        self.meta = tuple(meta_features)
        self.packed = [k for k in self.names if k not in self.meta]
        self.side_meta = [k for k in self.meta if k not in length_struct]
        alignments = _check_struct("pack_alignment_struct", pack_alignment_struct, self.names, "alignment")
        for key, value in alignments.items():
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"pack_alignment_struct[{key!r}] must be a positive integer, got {value!r}")
        self.alignments = np.asarray([int(alignments.get(k, 1)) for k in self.names], dtype=np.int64)
        self.padding = _check_struct("padding_struct", padding_struct, self.names, "padding value")
        self.length_struct = {k: int(v) for k, v in zip(self.names, self.lengths.tolist())}

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary (recorded in states, so a state of another packer is refused)."""
        return {
            "length_struct": self.length_struct,
            "meta_features": list(self.meta),
            "alignments": dict(zip(self.names, self.alignments.tolist())),
        }

    def arrays(self, element: Any) -> list[np.ndarray]:
        """The element's packed features as arrays (scalars as length-1 sequences).

        Raises:
            TypeError: the element is not a dict.
            KeyError: a feature of ``length_struct`` is missing.
        """
        if not isinstance(element, Mapping):
            raise TypeError(
                f"packing needs dict elements with the features {self.names}, got "
                f"{type(element).__name__}: {str(element)[:100]}"
            )
        out = []
        for key in self.names:
            if key not in element:
                raise KeyError(
                    f"the element has no feature {key!r} of length_struct (it has "
                    f"{sorted(element)}); map it to dicts with these keys before packing"
                )
            value = np.asarray(element[key])
            out.append(value.reshape(1) if value.ndim == 0 else value)
        return out

    def empty_rows(self, arrays: list[np.ndarray], count: int) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        """Buffers for ``count`` rows shaped after ``arrays``: values, segment ids, positions."""
        values, segments, positions = [], [], []
        for key, length, array in zip(self.names, self.lengths.tolist(), arrays):
            shape = (count, length, *array.shape[1:])
            fill = self.padding.get(key)
            values.append(np.zeros(shape, array.dtype) if fill is None else np.full(shape, fill, array.dtype))
            segments.append(np.zeros((count, length), np.int32))
            positions.append(np.zeros((count, length), np.int32))
        return values, segments, positions

    def row(
        self,
        values: list[np.ndarray],
        segments: list[np.ndarray],
        positions: list[np.ndarray],
        r: int,
        side: dict[str, list[Any]] | None = None,
    ) -> dict[str, Any]:
        """Row ``r`` of packed buffers as an output element."""
        out: dict[str, Any] = {}
        for i, key in enumerate(self.names):
            out[key] = values[i][r]
            if key not in self.meta:
                out[f"{key}_segment_ids"] = segments[i][r]
                out[f"{key}_positions"] = positions[i][r]
        for key in self.side_meta:
            out[key] = list((side or {}).get(key, []))
        return out
