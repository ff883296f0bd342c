"""A saved state, parsed once at the door into one typed value.

* :class:`LoaderState`: one host's engine state (what ``DataLoaderIterator.get_state``
  wrote), every field checked (:func:`~dataloader.engine.state.check_state`), its
  fingerprint checked (:func:`~dataloader.engine.fingerprint.check`).
* :class:`OldHosts`: every old host's state of one step, each taken apart by the stages
  of the pipeline restoring it (:class:`HostState`: one
  :class:`~dataloader.engine.restore.protocol.StatePart` per stage, then the engine's
  :class:`LoaderState`), and checked as a whole: one state per old host, one layout.

Nothing else in the package takes a state apart for a restore: each stage is handed
its part.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from dataloader.engine.fingerprint import KEY, check
from dataloader.engine.restore.protocol import StatePart, Used
from dataloader.engine.state import Cursor, check_state
from dataloader.errors import StateMismatchError


def as_json_value(state: Any) -> Any:
    """``state``, or the value its JSON text holds (text that is no JSON: as it is)."""
    if isinstance(state, (str, bytes, bytearray)):
        try:
            return json.loads(state)
        except ValueError:
            return state
    return state


@dataclasses.dataclass(frozen=True)
class LoaderState:
    """One host's engine state, checked.

    Attributes:
        state: the dict as ``get_state()`` wrote it.
        fingerprint: its checked ``"fingerprint"``, or None.
    """

    state: dict[str, Any]
    fingerprint: dict[str, Any] | None

    @classmethod
    def parse(cls, state: Any) -> LoaderState:
        """Raises :class:`StateMismatchError` naming the first invalid field."""
        checked = check_state(state)
        fp = checked.get(KEY)
        return cls(checked, None if fp is None else check(fp))

    @property
    def cursor(self) -> Cursor:
        return Cursor(self.state["position"], self.state["sub_index"], self.state["skip"])

    @property
    def made_for(self) -> dict[str, Any]:
        return self.state["made_for"]

    @property
    def elastic(self) -> Any:
        """The layout an elastic restore had given the saving host (None: plain)."""
        return self.state.get("elastic")


@dataclasses.dataclass(frozen=True)
class HostState:
    """One old host's state, taken apart by this pipeline's stages (top first)."""

    parts: tuple[StatePart, ...]
    head: LoaderState

    @property
    def used(self) -> list[Used]:
        """What the stages' states name as handed out beyond the engine's position."""
        return [u for part in self.parts for u in part.used]

    @property
    def shard(self) -> int:
        return int(self.head.made_for["shard_index"])


def _split(chain: Sequence[Any], state: Any) -> HostState:
    parts = []
    for stage in chain[:-1]:
        part = stage.split_state(as_json_value(state))
        parts.append(part)
        state = part.parent
    state = as_json_value(state)
    if not isinstance(state, dict) or "made_for" not in state:
        raise StateMismatchError(
            f"found no loader state (a dict with made_for) inside {str(state)[:200]}; pass "
            f"the states the pipeline's iterators returned"
        )
    return HostState(tuple(parts), LoaderState.parse(state))


@dataclasses.dataclass(frozen=True)
class OldHosts:
    """Every old host's state of one step (an elastic restore's input), checked.

    Attributes:
        hosts: one per old host, in the order given.
    """

    hosts: tuple[HostState, ...]

    @classmethod
    def parse(cls, chain: Sequence[Any], states: Sequence[Any]) -> OldHosts:
        """Each state taken apart by ``chain`` (the stages from the top down to the
        engine's iterator, :func:`~dataloader.engine.restore.protocol.chain_of`).

        Raises:
            StateMismatchError: a state a stage cannot take apart, or the states are not
                one per old host of one step of one run.
        """
        if not all(isinstance(s, (dict, str, bytes, bytearray)) for s in states):
            raise StateMismatchError(
                f"expected a state dict from get_state(), got list {str(list(states))[:200]}; for an "
                f"elastic restore, pass a list of every old host's state dicts"
            )
        if not states:
            raise StateMismatchError("elastic restore needs every old host's state, got none")
        hosts = tuple(_split(chain, s) for s in states)
        heads = [h.head for h in hosts]
        count = heads[0].made_for["shard_count"]
        shards = sorted(h.shard for h in hosts)
        if shards != list(range(count)) or any(h.made_for["shard_count"] != count for h in heads):
            raise StateMismatchError(
                f"elastic restore needs one state from each of the old hosts, got shards "
                f"{shards} of shard counts {sorted({h.made_for['shard_count'] for h in heads})}; "
                f"pass every old host's get_state() (e.g. every process's file of the checkpoint)"
            )
        if len({json.dumps(h.elastic, sort_keys=True) for h in heads}) != 1:
            raise StateMismatchError(
                f"the old hosts' states describe {len({json.dumps(h.elastic, sort_keys=True) for h in heads})} "
                f"different layouts; pass the states of one step of one run"
            )
        return cls(hosts)

    @property
    def count(self) -> int:
        """The old host count."""
        return len(self.hosts)

    def by_shard(self) -> list[HostState]:
        return sorted(self.hosts, key=lambda h: h.shard)

    def kept(self, stage: int) -> list[Any]:
        """The ``keep`` of stage ``stage`` (its index in the chain) of every old host."""
        return [h.parts[stage].keep for h in self.hosts]
