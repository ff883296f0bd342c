"""Where a host batch goes: one device, a sharding over local devices, or a global array.

:class:`Placement` resolves the device feed's ``target`` once, checks each host batch
against it (numeric leaves, one leading size, sizes that divide over the devices) and
puts it on the devices. When the sharding spans several JAX processes (it is not fully
addressable), each process holds only its own part of the batch, and
``jax.make_array_from_process_local_data`` stitches those parts into one global
``jax.Array`` whose leading axis is the processes' local batches in process order.
That needs no communication, but it assumes every process brings a batch of the same
shape: shard with ``drop_remainder=True`` and batch with ``Batch(drop_remainder=True)``.

The checks run in the device feed's thread (they are a few integer comparisons per
leaf), so a bad batch becomes an error at its place in the stream rather than a hang
or an opaque XLA message at the next training step.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, Sharding, SingleDeviceSharding

_NUMERIC_KINDS = frozenset("biufc")


def _leaf_name(path: tuple) -> str:
    return f"leaf {jax.tree_util.keystr(path)}" if path else "the batch (a single array)"


def _describe(leaf: Any) -> str:
    shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
    if shape is not None and dtype is not None:
        return f"shape {tuple(shape)}, dtype {dtype}"
    return f"a {type(leaf).__name__}: {str(leaf)[:60]!r}"


def _as_numeric(path: tuple, leaf: Any) -> np.ndarray:
    """The leaf as a numpy array, refusing what no device can hold."""
    array = leaf if isinstance(leaf, np.ndarray) else None
    if array is None and not isinstance(leaf, (str, bytes)):
        try:
            array = np.asarray(leaf)
        except Exception:  # a ragged list and the like: reported below by its type
            array = None
    # ml_dtypes (bfloat16, float8, int4) report kind 'V' but are numbers JAX takes.
    if array is None or not (
        array.dtype.kind in _NUMERIC_KINDS
        or getattr(array.dtype.type, "__module__", "") == "ml_dtypes"
    ):
        raise TypeError(
            f"{_leaf_name(path)} is not numeric ({_describe(leaf)}); the device feed "
            f"takes numeric arrays only (bool, integer, float, complex). Turn strings, "
            f"bytes or objects into numbers in a MapTransform, or drop the leaf, before "
            f"the batch reaches the device"
        )
    return array


def _local_splits(sharding: Sharding) -> dict[int, tuple[int, int, str]]:
    """For a NamedSharding: ``{axis: (parts of this process's data, parts in all, words)}``.

    An array axis mapped to mesh axes is cut into as many parts as the distinct
    coordinates this process's devices have along those mesh axes; across processes
    the parts of all processes make the global axis.
    """
    if not isinstance(sharding, NamedSharding):
        return {}
    mesh, me = sharding.mesh, jax.process_index()
    splits = {}
    for axis, entry in enumerate(tuple(sharding.spec)):
        if entry is None or entry == PartitionSpec.UNCONSTRAINED:
            continue
        names = entry if isinstance(entry, tuple) else (entry,)
        where = [mesh.axis_names.index(n) for n in names]
        coords = {
            tuple(index[w] for w in where)
            for index, device in np.ndenumerate(mesh.devices)
            if device.process_index == me
        }
        total = math.prod(mesh.shape[n] for n in names)
        axes = " x ".join(f"{n!r} ({mesh.shape[n]})" for n in names)
        local = f"{len(coords)} of them on this process, " if len(coords) != total else ""
        splits[axis] = (len(coords), total, f"the {total} devices of mesh axis {axes} ({local}{sharding.spec})")
    return splits


class Placement:
    """A resolved device-feed target: checks host batches and puts them on devices.

    Args:
        target: ``None`` (this process's first device, ``jax.local_devices()[0]``), a
            ``jax.Device``, or a ``jax.sharding.Sharding`` (e.g.
            ``NamedSharding(mesh, PartitionSpec("data"))``, which splits the leading
            batch axis over the mesh axis ``"data"``).

    Example:
        >>> placement = Placement(None)
        >>> batch = placement.put(placement.check({"x": np.arange(4)}))
        >>> type(batch["x"]).__name__
        'ArrayImpl'
    """

    def __init__(self, target: Any = None) -> None:
        if target is None:
            target = jax.local_devices()[0]
        if isinstance(target, jax.Device):
            target = SingleDeviceSharding(target)
        if isinstance(target, PartitionSpec):
            raise TypeError(
                f"target={target} is a PartitionSpec, which names mesh axes but no devices; "
                f"pass jax.sharding.NamedSharding(mesh, {target})"
            )
        if not isinstance(target, Sharding):
            raise TypeError(
                f"target must be None, a jax.Device or a jax.sharding.Sharding, got "
                f"{type(target).__name__}: {target!r}"
            )
        self.sharding: Sharding = target
        self.multi_process = not target.is_fully_addressable
        self._splits = _local_splits(target)
        # Only a sharding that cuts axis 0 makes the leading axis a batch axis that every
        # leaf must share; a single device takes leaves of any shapes.
        self._batch_axis = self._splits.get(0, (1, 1, ""))[1] > 1

    def check(self, batch: Any) -> Any:
        """Returns ``batch`` with numpy leaves, or raises naming the leaf that cannot go.

        Raises:
            TypeError: a leaf is not numeric (strings, bytes, objects).
            ValueError: leaves disagree on their leading (batch) size, or a size does not
                divide over the devices that share that axis.
        """
        flat, treedef = jax.tree_util.tree_flatten_with_path(batch)
        paths = [path for path, _ in flat]
        arrays = [_as_numeric(path, leaf) for path, leaf in flat]
        if self._batch_axis:
            self._check_batch_axis(paths, arrays)
        for path, array in zip(paths, arrays):
            self._check_divides(path, array)
        return jax.tree_util.tree_unflatten(treedef, arrays)

    def _check_batch_axis(self, paths: list[tuple], arrays: list[np.ndarray]) -> None:
        for path, array in zip(paths, arrays):
            if array.ndim == 0:
                raise ValueError(
                    f"{_leaf_name(path)} is a scalar ({_describe(array)}) but the sharding "
                    f"{self.sharding} splits axis 0 over devices; batch the records first "
                    f"(dl.Batch) so every leaf has a leading batch axis"
                )
        for path, array in zip(paths[1:], arrays[1:]):
            if array.shape[0] != arrays[0].shape[0]:
                raise ValueError(
                    f"the leaves of one batch must share their leading (batch) size to be "
                    f"split over devices, but {_leaf_name(paths[0])} has shape "
                    f"{arrays[0].shape} and {_leaf_name(path)} has shape {array.shape} "
                    f"(ragged); pad or batch them alike"
                )

    def _check_divides(self, path: tuple, array: np.ndarray) -> None:
        for axis, (parts, _, where) in self._splits.items():
            if axis >= array.ndim:
                raise ValueError(
                    f"{_leaf_name(path)} has {_describe(array)}, but the sharding splits "
                    f"axis {axis} over {where}; give the leaf that axis or shard fewer axes"
                )
            if array.shape[axis] % parts:
                fit = max(parts, array.shape[axis] // parts * parts)
                raise ValueError(
                    f"{_leaf_name(path)} has {_describe(array)}: its axis {axis} of size "
                    f"{array.shape[axis]} does not divide over {where}, which need a "
                    f"multiple of {parts} here; use a per-host batch size that is a "
                    f"multiple of {parts} (e.g. {fit}), and Batch(drop_remainder=True) "
                    f"if the last batch of an epoch is short"
                )
        if not self._splits and not self.multi_process:
            try:
                self.sharding.shard_shape(array.shape)
            except Exception as e:  # jax's own check, for shardings other than NamedSharding
                raise ValueError(
                    f"{_leaf_name(path)} has {_describe(array)}, which does not fit the "
                    f"sharding {self.sharding}: {e}"
                ) from e

    def put(self, batch: Any) -> Any:
        """Starts the transfer of a checked batch; returns its leaves as ``jax.Array``.

        The transfer is asynchronous: the arrays are usable at once and a computation
        that reads them waits for the bytes only if they have not arrived yet.
        """
        if self.multi_process:
            return jax.make_array_from_process_local_data(self.sharding, batch)
        return jax.device_put(batch, self.sharding)
