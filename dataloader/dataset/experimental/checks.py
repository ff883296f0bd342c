"""Checks shared by this room: parents are IterDatasets."""

from __future__ import annotations

from typing import Any


def as_iter_dataset(parent: Any, what: str) -> Any:
    """``parent`` as an ``IterDataset`` (a ``MapDataset`` becomes its ``to_iter_dataset()``)."""
    from dataloader.dataset.base import IterDataset
    from dataloader.dataset.map_dataset import MapDataset

    if isinstance(parent, MapDataset):
        return parent.to_iter_dataset()
    if not isinstance(parent, IterDataset):
        raise TypeError(
            f"{what} reads an IterDataset (e.g. MapDataset...to_iter_dataset()), got {parent!r}"
        )
    return parent
