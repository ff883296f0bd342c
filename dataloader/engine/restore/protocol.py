"""``ElasticStage``: what a stage answers to take part in an elastic restore.

An elastic restore hands every old host's state to the pipeline of one new host
(``iterator.set_state([state of host 0, state of host 1, ...])``, an Orbax restore on
another process count, ``ElasticIterator.set_shard_states``). The pipeline is a chain
of stages over the engine's iterator (a batch over a packer over a window shuffle over
a stream on the engine, say). The restore room (:mod:`.every_host`) needs from each
stage exactly the answers written here, and reads them with ``isinstance`` once, when
the restore is made, so a stage that cannot take part is refused there, by name:

* the engine's iterator (``DataLoaderIterator``) is the :class:`ElasticHead` at the
  bottom of every chain: it reads the positions no old host used, on its new layout;
* every stage above it is an :class:`ElasticStage`.

Obligations of an :class:`ElasticStage` (see docs/elastic-protocol.md for a user's own):

* ``elastic_parent``: the stage it reads (the next one down the chain), or None when it
  cannot take part as it is configured (the restore is then refused, naming it).
* ``split_state(state)``: its own state, taken apart: a :class:`StatePart` with the
  parent's state inside it, the engine outputs its state names as handed out beyond
  that parent state (``used``: the records of a packer's rows already handed out, a
  window's elements already handed out), and anything of its own the restart needs
  (``keep``). A state that holds records it cannot name (a middle piece of a cut
  element, outputs of one element partly handed out) is refused here with
  :class:`~dataloader.errors.StateMismatchError` saying what.
* ``last_tag()``: the engine tags ``(position, sub)`` of the records its last output
  holds (one pair, or a tuple of pairs for a row of several), or None when it cannot
  say. A stage over it names its own outputs' records by them.
* ``restart_elastic(resume, kept)``: start empty over the parent, once ``resume()`` has
  moved the parent (and everything under it) onto this host's share of what the old
  hosts left unread. Call ``resume()`` exactly once, from the thread that reads the
  parent (a stage that reads its parent in a thread of its own calls it there).
  ``kept`` is the ``keep`` of every old host's :class:`StatePart`, in host order.

A stage whose state is its parent's state with fields of its own added, and that holds
no records, answers ``StatePart(parent=state_without_its_fields)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from dataloader.errors import StateMismatchError

# (local position, sub) of an engine output, or a tuple of such tags (a packed row).
Tag = Any
# What a stage's state names as handed out: (local position, sub, None or offsets).
Used = tuple[int, int, Any]


@dataclasses.dataclass(frozen=True)
class StatePart:
    """One stage's state, taken apart by the stage (:meth:`ElasticStage.split_state`).

    Attributes:
        parent: the state of the stage under it, where its held records begin.
        used: engine outputs its state names as handed out beyond ``parent``.
        keep: what the stage's restart needs of this old host's state (or None).
    """

    parent: Any
    used: tuple[Used, ...] = ()
    keep: Any = None


@runtime_checkable
class ElasticStage(Protocol):
    """A stage over another that takes part in an elastic restore (see the module)."""

    @property
    def elastic_parent(self) -> Any: ...

    def split_state(self, state: Any) -> StatePart: ...

    def last_tag(self) -> Tag | None: ...

    def restart_elastic(self, resume: Callable[[], None], kept: Sequence[Any]) -> None: ...


@runtime_checkable
class ElasticHead(Protocol):
    """The engine's iterator, at the bottom of every elastic chain.

    * ``last_tag()``: as :class:`ElasticStage`'s, for the element handed out last.
    * ``prepare_hosts(hosts)``: computes and checks what it will read after the restore
      (this host's share of what the old hosts left unread; ``hosts`` is the parsed
      :class:`~dataloader.engine.restore.saved.OldHosts`), raising
      :class:`~dataloader.errors.StateMismatchError` when that fails, and returns the
      function that moves it there, starting empty (called once, after every check,
      from the thread that reads it). It changes nothing itself.
    * ``sampler``: the sampler it reads; before a restore its ``shard_options`` say which
      host this is among how many (a token mixture over it splits the old hosts' token
      counts over the new hosts by them).
    """

    def last_tag(self) -> Tag | None: ...

    def prepare_hosts(self, hosts: Any) -> Callable[[], None]: ...

    @property
    def sampler(self) -> Any: ...


@runtime_checkable
class RestoresEveryHost(Protocol):
    """A stage over several parents (a mixture) that takes every old host's states itself.

    ``restore_every_host(states)``: ``states`` holds one state of this stage per old host;
    the stage hands each parent that parent's states from every old host (each parent a
    chain the restore room restores, or another such stage) and continues its own
    counters from the old hosts'. ``set_state`` with a list comes here (not to the chain
    walk of :func:`chain_of`, which follows one parent)."""

    def restore_every_host(self, states: Sequence[Any]) -> None: ...


def _refuse(stage: Any, count: int, why: str) -> StateMismatchError:
    return StateMismatchError(
        f"an elastic restore (every old host's {count} states) cannot run through "
        f"{stage!r} ({type(stage).__name__}): {why}; restore on the same host count, or see "
        f"docs/elastic-protocol.md for what a stage answers to take part"
    )


def chain_of(top: Any, count: int = 0) -> list[Any]:
    """The stages from ``top`` down to the engine's iterator, each checked once.

    Raises:
        StateMismatchError: a stage does not take part (named, with why); ``count`` is
            the number of old states, for the message.
    """
    chain: list[Any] = []
    stage = top
    while not isinstance(stage, ElasticHead):
        if not isinstance(stage, ElasticStage):
            what = "it restores from one state only" if hasattr(stage, "set_state") else "it has no state"
            raise _refuse(stage, count, f"{what} (it is no ElasticStage: elastic_parent, "
                                        f"split_state, last_tag, restart_elastic)")
        parent = stage.elastic_parent
        if parent is None:
            raise _refuse(stage, count, "it restores from one state only, as it is configured")
        chain.append(stage)
        stage = parent
    chain.append(stage)
    return chain


def takes_every_host(top: Any) -> bool:
    """Whether ``top`` restores from every old host's states (what an Orbax restore on
    another process count asks before handing them over)."""
    if isinstance(top, RestoresEveryHost):
        return True
    try:
        chain_of(top)
    except StateMismatchError:
        return False
    return True


def no_tag() -> None:
    """The tag reader of a parent that takes no part in an elastic restore (see
    :func:`tag_reader`); a stage may compare with it to skip reading tags at all."""
    return None


def tag_reader(parent: Any) -> Callable[[], Tag | None]:
    """How a stage reads the engine tags of its parent's last output: the parent's
    ``last_tag`` when the parent takes part in an elastic restore (asked once, when the
    stage is made), else a function that always says None (its outputs cannot be named,
    and a state holding them is refused for an elastic restore)."""
    if isinstance(parent, (ElasticStage, ElasticHead)):
        return parent.last_tag
    return no_tag



class ElasticDefaults:
    """What most stages answer in the protocol, as a base to list after
    ``DatasetIterator``: the stage under it is its one parent; its outputs are no single
    engine element (``last_tag()`` None); it holds nothing between outputs (its state's
    ``"parent"`` is its part) and restarts by moving its parent. A stage overrides what
    it answers otherwise."""

    _parent: Any

    @property
    def elastic_parent(self) -> Any:
        return self._parent

    def last_tag(self) -> Tag | None:
        return None

    def split_state(self, state: Any) -> StatePart:
        return StatePart(state["parent"])

    def restart_elastic(self, resume: Callable[[], None], kept: Sequence[Any]) -> None:
        resume()
