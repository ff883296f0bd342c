"""Checks shared by this room: parents are IterDatasets; a mixture's per-component states."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dataloader.errors import StateMismatchError


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


def per_component(saved: Any, keys: list[str] | None, defaults: Sequence[Any], what: str) -> list[Any]:
    """A mixture state's per-component ``saved`` values (a list, or a dict by name) in the
    components' order; a named component the state lacks gets its ``defaults`` entry.

    Raises:
        StateMismatchError: a list of another length, or a list where names are expected
            (or the reverse).
    """
    if keys is None:
        if not isinstance(saved, list) or len(saved) != len(defaults):
            raise StateMismatchError(
                f"this state holds {_describe(saved, what)} but the mixture has {len(defaults)} "
                f"components; restore into a mixture of the same datasets (mix a dict of named "
                f"datasets to change them across restores)"
            )
        return list(saved)
    if not isinstance(saved, dict):
        raise StateMismatchError(
            f"this mixture is of named datasets {keys}, but the state holds {_describe(saved, what)}; "
            f"restore a state of a mixture of a dict"
        )
    return [saved.get(k, d) for k, d in zip(keys, defaults)]


def _describe(saved: Any, what: str) -> str:
    if isinstance(saved, list):
        return f"{len(saved)} component {what}"
    if isinstance(saved, dict):
        return f"component {what} named {sorted(saved)}"
    return repr(saved)[:100]
