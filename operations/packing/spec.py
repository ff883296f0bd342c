"""What a packer packs: features, their row lengths, meta features, alignment and padding.

Elements are dicts. Every feature named in ``length_struct`` is a sequence (a numpy
array whose first axis is the sequence; a scalar counts as a sequence of one) packed
into rows of that feature's length. Packed features get ``<f>_segment_ids`` (1, 2, ...
per element in the row, 0 for padding) and ``<f>_positions`` (0, 1, ... within each
segment), as Grain writes them. ``meta_features`` named in ``length_struct`` are packed
the same way but get neither; meta features not in ``length_struct`` are not sequences:
each row lists the values of the elements it holds (an object array).

As in Grain, ``length_struct`` may nest: ``{"tokens": 2048, "extra": {"ids": 16}}``
packs ``element["extra"]["ids"]`` into the row's ``row["extra"]["ids"]``. A nested
feature must be a meta feature (``meta_features=["extra"]``): Grain writes segment ids
and positions only for top-level features, and fails at the first row on a nested one
that is not meta; here that is refused when the packer is built. Inside the spec, a
nested feature is named by its path joined with ``/`` (``"extra/ids"``);
``pack_alignment_struct`` and ``padding_struct`` nest the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def _leaves(struct: Mapping[str, Any], where: str, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """The ``(path, value)`` of every leaf of a nested dict, in its order."""
    out = []
    for key, value in struct.items():
        if not isinstance(key, str):
            raise TypeError(f"{where} keys must be feature names (str), got {key!r}")
        path = (*prefix, key)
        if isinstance(value, Mapping):
            if not value:
                raise ValueError(f"{where}[{'/'.join(path)!r}] is an empty dict; give it features or leave it out")
            out.extend(_leaves(value, where, path))
        else:
            out.append((path, value))
    return out


def _check_struct(name: str, struct: Any, labels: Sequence[str], kind: str) -> dict[str, Any]:
    """A (possibly nested) per-feature struct as ``{feature label: value}``."""
    if struct is None:
        return {}
    if not isinstance(struct, Mapping):
        raise TypeError(f"{name} must be a dict of feature -> {kind}, got {struct!r}")
    flat = {"/".join(path): value for path, value in _leaves(struct, name)}
    unknown = sorted(set(flat) - set(labels))
    if unknown:
        raise ValueError(
            f"{name} names {unknown}, which are not in length_struct {list(labels)}; give "
            f"{kind}s only for the features that are packed"
        )
    return flat


class PackSpec:
    """The checked description of what is packed (shared by all packers).

    Attributes:
        names: one label per packed feature (a nested one's path joined with ``/``).
        paths: each feature's path of keys into an element.
        lengths: each feature's row length.
        is_meta: whether each feature is a meta feature (no segment ids, positions).

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
        if isinstance(meta_features, str):
            raise TypeError(f"meta_features must be a list of feature names, got the string {meta_features!r}")
        self.meta = tuple(meta_features)
        leaves = _leaves(length_struct, "length_struct")
        for path, length in leaves:
            if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
                raise ValueError(f"length_struct[{'/'.join(path)!r}] must be a positive integer, got {length!r}")
            if len(path) > 1 and path[0] not in self.meta:
                raise ValueError(
                    f"length_struct[{path[0]!r}] is a nested dict; nested features are packed "
                    f"only as meta features (values padded into the row, no segment ids or "
                    f"positions), as in Grain: add {path[0]!r} to meta_features"
                )
        self.paths = [path for path, _ in leaves]
        self.names = ["/".join(path) for path in self.paths]
        self.nested = any(len(path) > 1 for path in self.paths)
        self.lengths = np.asarray([int(length) for _, length in leaves], dtype=np.int64)
        self.is_meta = [path[0] in self.meta for path in self.paths]
        self.packed = [k for k, meta in zip(self.names, self.is_meta) if not meta]
        self.side_meta = [k for k in self.meta if k not in length_struct]
        alignments = _check_struct("pack_alignment_struct", pack_alignment_struct, self.names, "alignment")
        for key, value in alignments.items():
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"pack_alignment_struct[{key!r}] must be a positive integer, got {value!r}")
        self.alignments = np.asarray([int(alignments.get(k, 1)) for k in self.names], dtype=np.int64)
        self.padding = _check_struct("padding_struct", padding_struct, self.names, "padding value")
        self.length_struct = _nest(self.paths, [int(n) for n in self.lengths.tolist()])

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
            TypeError: the element (or a dict on a nested feature's path) is not a dict.
            KeyError: a feature of ``length_struct`` is missing.
        """
        if not isinstance(element, Mapping):
            raise TypeError(
                f"packing needs dict elements with the features {self.names}, got "
                f"{type(element).__name__}: {str(element)[:100]}"
            )
        out = []
        for path in self.paths:
            value = element
            for depth, key in enumerate(path):
                if not isinstance(value, Mapping):
                    raise TypeError(
                        f"the element's {'/'.join(path[:depth])!r} is "
                        f"{type(value).__name__}, not the dict length_struct nests there"
                    )
                if key not in value:
                    where = "the element" if depth == 0 else f"the element's {'/'.join(path[:depth])!r}"
                    raise KeyError(
                        f"{where} has no feature {key!r} of length_struct (it has "
                        f"{sorted(value)}); map it to dicts with these keys before packing"
                    )
                value = value[key]
            array = np.asarray(value)
            out.append(array.reshape(1) if array.ndim == 0 else array)
        return out

    def replace(self, element: Mapping[str, Any], arrays: list[np.ndarray]) -> dict[str, Any]:
        """A copy of ``element`` with its packed features replaced by ``arrays``."""
        out = dict(element)
        for path, array in zip(self.paths, arrays):
            node = out
            for key in path[:-1]:
                node[key] = dict(node[key])
                node = node[key]
            node[path[-1]] = array
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
        for i, (key, path) in enumerate(zip(self.names, self.paths)):
            node = out
            for step in path[:-1]:
                node = node.setdefault(step, {})
            node[path[-1]] = values[i][r]
            if not self.is_meta[i]:
                out[f"{key}_segment_ids"] = segments[i][r]
                out[f"{key}_positions"] = positions[i][r]
        for key in self.side_meta:
            out[key] = list((side or {}).get(key, []))
        return out


def _nest(paths: list[tuple[str, ...]], values: list[Any]) -> dict[str, Any]:
    """The nested dict with ``values`` at ``paths``."""
    out: dict[str, Any] = {}
    for path, value in zip(paths, values):
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out
