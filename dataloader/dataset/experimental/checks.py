"""Checks shared by this room: states have the fields their iterator wrote, sizes, parents."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dataloader.errors import StateMismatchError


def expect_state(state: Any, keys: Sequence[str], where: str) -> dict[str, Any]:
    """``state`` if it is a dict with ``keys``, else a :class:`StateMismatchError`.

    Args:
        state: what ``set_state`` was given.
        keys: the fields the iterator's ``get_state`` writes.
        where: the iterator's name, for the message.
    """
    if not isinstance(state, dict) or any(k not in state for k in keys):
        raise StateMismatchError(
            f"expected a state of {where} (a dict with {list(keys)}), got {str(state)[:200]}; "
            f"restore with the state this pipeline's iterator returned"
        )
    return state


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
