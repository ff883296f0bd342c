"""Which streams run on the engine, and as what: the lowering of stream pipelines.

A stream whose record at each position can be found without reading the ones before
has a random-access form over its stream order: a ``MapDataset`` whose item ``p`` is
element ``p`` of the stream. Then the element-wise calls chained on it (``map``,
``filter``, ``flat_map``, ``random_map``, ``batch``) compile to the engine over that form
and run in worker processes, unit by unit, with the output of the stream read in order.
The forms (:func:`stream_form`):

* ``ParquetIterDataset(paths)``: :class:`~dataloader.dataset.streams.parquet_source.
  ParquetStreamSource` over its files, interleaved 16 at a time as it reads them.
* ``TFRecordIterDataset(paths)`` of local, uncompressed files: :class:`~dataloader.dataset.
  streams.tfrecord_source.TFRecordStreamSource` over the record offsets of its files
  (read from the frame headers), interleaved 16 at a time. Gzip files have no offsets to
  jump to: their streams stay at the iterator level.
* ``InterleaveIterDataset(datasets, cycle_length=k)`` where every dataset is a
  ``ParquetIterDataset`` (or every one a ``TFRecordIterDataset``, as above) of one file
  (MaxText's ``MapDataset.source(paths).shuffle().repeat(n).map(ParquetIterDataset)``, a
  finite list): the same source over that file sequence, interleaved ``k`` at a time.
* ``WindowShuffleIterDataset`` over one of these: ``WindowShuffleMapDataset`` over the
  form, which on one pass gives the same order (window ``w`` is keyed by ``(seed, w)``
  in both).

Anything else (an endless file list, a user's dataset, packers...) has no form
and runs at the iterator level, in the consumer. Each form also reads the states of the
streaming iterators it replaces (file, interleave, window shuffle, iterator-level
element-wise stage) as a position, so their checkpoints continue on the engine.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dataloader.errors import StateMismatchError

if TYPE_CHECKING:
    from dataloader.dataset.iter_dataset import LoaderIterDataset
    from dataloader.dataset.map_dataset import MapDataset


@dataclasses.dataclass(frozen=True)
class StreamForm:
    """A stream as random access over its order, and how to read its streaming states."""

    dataset: MapDataset
    position_of_state: Callable[[dict[str, Any]], int]


def stream_form(ds: Any) -> StreamForm | None:
    """The random-access form of the stream ``ds`` (see the module), or None."""
    from dataloader.dataset.streams.files import FileIterDataset
    from dataloader.dataset.transformations.elementwise import SeedScope
    from dataloader.dataset.transformations.interleave import InterleaveIterDataset
    from dataloader.dataset.transformations.window_shuffle import WindowShuffleIterDataset

    if isinstance(ds, FileIterDataset):
        return ds._stream_form()
    if type(ds) is SeedScope:
        return stream_form(ds.parents[0])
    if type(ds) is InterleaveIterDataset:
        return _interleave_form(ds)
    if type(ds) is WindowShuffleIterDataset:
        parent = stream_form(ds.parents[0])
        return None if parent is None else _window_form(parent, ds.window_size, ds.window_seed)
    return None


def on_engine(ds: Any) -> LoaderIterDataset | None:
    """``ds`` as an engine-backed dataset, under its seed, or None when it has no form."""
    from dataloader.dataset.iter_dataset import LoaderIterDataset

    form = stream_form(ds)
    if form is None:
        return None
    out = LoaderIterDataset(form.dataset, position_of_state=functools.partial(_stage_state, form.position_of_state))
    return out if ds._seed is None else out.seed(ds._seed)


def _stage_state(position_of_state: Callable[[dict[str, Any]], int], state: dict[str, Any]) -> int:
    """The position of a state of the iterator-level element-wise stages that ran on the
    stream (``{"parent", "index", "skip"}``, a batch's ``{"parent"}``) before it ran here."""
    while isinstance(state, dict) and "parent" in state and ("index" in state or len(state) == 1):
        if int(state.get("skip", 0)):
            raise StateMismatchError(
                "this state was saved in the middle of a flat map's outputs by the "
                "iterator-level stage, which the engine continues only between "
                "elements; restore it with the version of granary that saved it"
            )
        state = state["parent"]
    return position_of_state(state)


def _interleave_form(ds: Any) -> StreamForm | None:
    from dataloader.dataset.streams.parquet import ParquetIterDataset
    from dataloader.dataset.streams.parquet_source import ParquetStreamSource
    from dataloader.dataset.streams.tfrecord import TFRecordIterDataset, stream_source_form

    datasets = ds._datasets
    if len(datasets) >= sys.maxsize or len(datasets) == 0:  # an endless file list has no end to plan
        return None
    files = [datasets[i] for i in range(len(datasets))]
    if all(type(f) is TFRecordIterDataset and len(f._paths) == 1 and f._seekable() for f in files):
        return stream_source_form([f._paths[0] for f in files], ds.cycle_length)
    first = files[0]
    for f in files:
        if type(f) is not ParquetIterDataset or len(f._paths) != 1:
            return None
        if f.columns != first.columns or f.read_kwargs != first.read_kwargs:
            return None
    paths = [f._paths[0] for f in files]
    source = ParquetStreamSource(paths, [f._group_rows[p] for f, p in zip(files, paths)],
                                 first.columns, first.read_kwargs, ds.cycle_length)
    return StreamForm(_source_dataset(source), source.position_of_state)


def _source_dataset(source: Any) -> MapDataset:
    from dataloader.dataset.map_dataset import MapDataset

    return MapDataset.source(source)


def _window_form(parent: StreamForm, size: int, seed: int) -> StreamForm:
    from dataloader.dataset.transformations.window_shuffle import WindowShuffleMapDataset

    def position_of_state(state: dict[str, Any]) -> int:
        if not all(k in state for k in ("parent", "window_index", "pos_in_window")):
            raise StateMismatchError(
                f"{sorted(state)} is not a state of a window shuffle; pass a state that "
                f"get_state() of this pipeline returned"
            )
        saved = (state.get("window_size"), state.get("seed"))
        if saved != (size, seed):
            raise StateMismatchError(
                f"this state was saved by a window shuffle with window_size={saved[0]} and "
                f"seed={saved[1]} but this one has window_size={size} and seed={seed}; "
                f"restore with the arguments the state was made for"
            )
        # Windows are consecutive stretches of the parent: the state's window starts at
        # the parent's position in it, and ``pos_in_window`` of it were handed out.
        return parent.position_of_state(state["parent"]) + int(state["pos_in_window"])

    return StreamForm(WindowShuffleMapDataset(parent.dataset, window_size=size, seed=seed), position_of_state)
