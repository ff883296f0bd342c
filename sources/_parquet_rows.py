"""Decodes a Parquet row group once so that single rows come out cheaply.

Each column becomes a getter ``row -> value`` over containers built once per
row group, so getting a row is a dict of a few list or array look-ups:

=========================================  ==================================
Arrow type                                 value of one row
=========================================  ==================================
integer, floating point, boolean           numpy scalar (``np.int64(3)``)
timestamp, date, duration                  numpy ``datetime64``/``timedelta64``
string / large_string                      ``str``
binary / large_binary / fixed_size_binary  ``bytes``
list of integer, float or boolean          1-D numpy array (a copy)
anything else (struct, decimal, ...)       what ``pyarrow`` ``as_py`` gives
null                                       ``None``
=========================================  ==================================

Numeric columns stay numpy arrays and make their scalar only when a row is
asked for: with random access a decoded row group often serves a handful of
rows, so building a Python object per row up front would waste most of it.
Strings and bytes are the exception: ``to_pylist`` builds them in C far faster
than one ``as_py`` per row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

Getter = Callable[[int], Any]


def _is_numpy_scalar_type(arrow_type: pa.DataType) -> bool:
    return (
        pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
        or pa.types.is_boolean(arrow_type)
        or pa.types.is_timestamp(arrow_type)
        or pa.types.is_date(arrow_type)
        or pa.types.is_duration(arrow_type)
    )


def _is_primitive_list_type(arrow_type: pa.DataType) -> bool:
    is_list = (
        pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
        or pa.types.is_fixed_size_list(arrow_type)
    )
    if not is_list:
        return False
    value_type = arrow_type.value_type
    return (
        pa.types.is_integer(value_type)
        or pa.types.is_floating(value_type)
        or pa.types.is_boolean(value_type)
    )


def _numpy_values(array: pa.Array) -> np.ndarray:
    """Returns the values of a numeric array as numpy, nulls filled in."""
    if array.null_count and not pa.types.is_floating(array.type):
        # to_numpy would turn an int column with nulls into float64; fill the
        # nulls (masked out by the caller) to keep the dtype.
        zero = False if pa.types.is_boolean(array.type) else 0
        array = array.fill_null(pa.scalar(zero, type=array.type))
    return array.to_numpy(zero_copy_only=False)


def _with_nulls(array: pa.Array, getter: Getter) -> Getter:
    if not array.null_count:
        return getter
    is_null = array.is_null().to_pylist()
    return lambda row: None if is_null[row] else getter(row)


def _list_getter(array: pa.Array) -> Getter:
    lengths = pc.list_value_length(array).fill_null(0).to_numpy(zero_copy_only=False)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    flat = pc.list_flatten(array)
    if flat.null_count:
        # A null inside a list has no numeric value: fall back to objects.
        values = np.empty(len(flat), dtype=object)
        values[:] = flat.to_pylist()
    else:
        values = flat.to_numpy(zero_copy_only=False)
    # Copy so a row does not keep the whole row group's buffer alive.
    return _with_nulls(array, lambda row: values[offsets[row] : offsets[row + 1]].copy())


def column_getter(array: pa.Array | pa.ChunkedArray) -> Getter:
    """Returns a function from row number to the value of ``array`` there."""
    return _column(array)[0]


def _column(array: pa.Array | pa.ChunkedArray) -> tuple[Getter, Any]:
    """The getter of ``array``, and the container of every row's value where there is
    one (a list, or a numpy array whose items are the values), else ``None``."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if _is_numpy_scalar_type(array.type):
        values = _numpy_values(array)
        return _with_nulls(array, values.__getitem__), None if array.null_count else values
    if _is_primitive_list_type(array.type):
        return _list_getter(array), None
    values = array.to_pylist()
    return values.__getitem__, values


class DecodedRowGroup:
    """A row group decoded into per-column getters.

    Example:
        >>> group = DecodedRowGroup(pa.table({"x": [1, 2], "s": ["a", None]}))
        >>> group.row(1)
        {'x': np.int64(2), 's': None}
    """

    __slots__ = ("_columns", "_getters", "num_rows")

    def __init__(self, table: pa.Table) -> None:
        self.num_rows = table.num_rows
        self._columns = [(name, *_column(table.column(name))) for name in table.column_names]
        self._getters = [(name, get) for name, get, _ in self._columns]

    def row(self, row: int) -> dict[str, Any]:
        """Returns row ``row`` (within the group) as a dict column -> value."""
        return {name: get(row) for name, get in self._getters}

    def rows(self, start: int, stop: int) -> list[dict[str, Any]]:
        """Returns rows ``start`` to ``stop`` (the same dicts as :meth:`row`), for reading
        in order: slices and ``zip`` build them about twice as fast as one ``row`` each."""
        names = [name for name, _, _ in self._columns]
        columns = [
            values[start:stop] if values is not None else [get(i) for i in range(start, stop)]
            for _, get, values in self._columns
        ]
        return [dict(zip(names, row)) for row in zip(*columns)]
