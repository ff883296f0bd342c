"""Packing stages: fixed-length rows out of an ordered stream of variable-length sequences.

Both run in the consumer's process on the ordered stream (so the rows never depend on
the number of workers) and resume from a small state without replaying the stream:

* :class:`FitPackIterator` (first-fit, best-fit) packs in rounds. Its state is where the
  current round starts (the parent's state before the round's first element, and which
  piece of that element) plus how many of the round's rows were handed out: a restore
  re-packs that one round, never more (``num_packing_bins`` rows).
* :class:`ConcatIterator` (concat-then-split) fills one row at a time (plus, with
  ``split_full_length_features=False``, the full-length rows that arrive meanwhile). Its
  state is the parent's state before the element the next fill starts in and the offset
  into it: a restore reads that one element again; while a fill's rows are still being
  handed out, ``skip`` says how many came out, and a restore fills that one row again.

A state records the packer it was made for (lengths, bins, seed, ...), and a state of
another packer is refused with :class:`~dataloader.StateMismatchError`.

For an elastic restore (:mod:`dataloader.engine.restore`), a state taken while a round
or a fill is partly handed out (or an element is partly in rows) also names what its
handed rows used, as ``"used": [[position, sub, offsets or null], ...]``: the engine's
local position and output rank of each element in them, with the offsets where an
element's unused rest starts (concat-then-split). The records of the open bins are
those the state does not name: an elastic restore hands them to the new hosts, which
pack them again in their own streams. Only a packer reading the engine's elements
directly, or through stages that say which engine elements their last output holds
(``last_tag()`` of the :class:`~dataloader.engine.restore.protocol.ElasticStage`
protocol: a window shuffle, a map or filter run element by element or on the pool, a
first-fit packer whose last row holds its records whole), can name them; over another
stage (a flat map at the iterator level, a packer cutting the rows of another) its
mid-round states are refused for an elastic restore. Both packers are
``ElasticStage``s: restarted by an elastic restore, a packer starts empty.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dataloader.engine.restore.protocol import ElasticDefaults, StatePart, tag_reader
from dataloader.engine.stages.base import DatasetIterator, expect_state
from dataloader.errors import PipelineError, StateMismatchError
from dataloader.operations.packing import ConcatThenSplit, FitPack


def _check_packer(state: Any, op: Any, where: str) -> dict[str, Any]:
    expect_state(state, ("parent", "packer"), where)
    if state["packer"] != op.describe():
        raise StateMismatchError(
            f"this state was saved for the packer {state['packer']} but this pipeline packs with "
            f"{op.describe()}; restore with the packer the state was made for"
        )
    return state


def _flat(tag: Any) -> list[tuple[int, int]]:
    """The ``(position, sub)`` pairs of a tag or a group."""
    return [tag] if isinstance(tag[0], int) else [t for g in tag for t in _flat(g)]


def held_part(state: dict[str, Any], held: dict[str, Any], what: str) -> StatePart:
    """A stage's :class:`StatePart` when its ``state`` holds records (``held``: the fields
    that say how many; none non-zero: it holds nothing): they must be named as the
    engine's outputs in ``"used"``, else an elastic restore would lose or repeat them."""
    if any(held.values()) and "used" not in state:
        raise StateMismatchError(
            f"this state holds records in a stage ({what}, {held}) that it does not name "
            f"as positions, so an elastic restore would lose or repeat them: rows of a round "
            f"handed out so that a middle piece of an element cut into pieces came out before "
            f"both its neighbours, or a packer or window shuffle over a stage that cannot say "
            f"which engine elements its outputs hold (a flat map after an iterator-level "
            f"stage, a packer cutting another packer's rows); save at another step or restore "
            f"on the same host count"
        )
    used = tuple((int(q), int(sub), u) for q, sub, u in state.get("used", ()))
    return StatePart(state["parent"], used)


def used_of(entries: list[tuple[tuple[int, int] | None, Any]]) -> list[list[Any]] | None:
    """``entries`` (tag, None or offsets: a later one about the same tag wins) as a
    state's ``"used"``; None when a tag is unknown."""
    final: dict[tuple[int, int], Any] = {}
    for tag, offsets in entries:
        if tag is None:
            return None
        group = _flat(tag)
        if len(group) > 1 and offsets is not None:
            return None  # part of a packed row: its records cannot be told apart
        for t in group:
            final[t] = offsets
    return [[q, sub, used] for (q, sub), used in sorted(final.items())]


def _failed(op: Any, exc: Exception) -> PipelineError:
    return PipelineError(f"{op.name} failed: {type(exc).__name__}: {exc}", operation=op.name)


class _PackIterator(DatasetIterator, ElasticDefaults):
    """What both packing stages share: the packer, and what a state records about it."""

    stats_batches = False  # stats(): its rows are the elements out

    def __init__(self, parent: DatasetIterator, op: Any) -> None:
        super().__init__(parent)
        self.stats_name = op.name
        self._op = op
        self._describe = op.describe()
        self._parent_tag = tag_reader(parent)

    # The elastic-restore protocol (dataloader.engine.restore.protocol.ElasticStage).

    def split_state(self, state: Any) -> StatePart:
        state = _check_packer(state, self._op, f"the packer {self._op.name}")
        held = {k: state[k] for k in ("piece", "next_row", "offsets", "skip") if k in state}
        return held_part(state, held, state["packer"])

    def restart_elastic(self, resume: Callable[[], None], kept: Sequence[Any]) -> None:
        """The parent reads this host's share of what every old host left unread, the
        open bins' records included, and this packer starts empty over it."""
        resume()
        self.__init__(self._parent, self._op)  # type: ignore[misc]  # a fresh packer over it


class FitPackIterator(_PackIterator):
    """First-fit or best-fit packing of the parent's elements, round by round."""

    _op: FitPack

    def __init__(self, parent: DatasetIterator, op: FitPack) -> None:
        super().__init__(parent, op)
        self._start: tuple[Any, int] = (parent.get_state(), 0)  # where the round starts
        self._counter = 0  # rows of the rounds before it
        self._rows: list[dict[str, Any]] | None = None
        self._order: list[int] = []
        self._next_row = 0
        self._skip = 0  # rows to pass over once the round is re-packed (a restore)
        self._carry: tuple[list[Any], int, Any, Any] | None = None  # (pieces, first piece, state before, tag)
        self._after: tuple[Any, int] | None = None  # where the next round starts
        # Each row's elements as (tag, piece, pieces) for an elastic restore, and the
        # (tag, piece, pieces) of the element the round starts inside (None: a fresh one).
        self._members: list[list[tuple[Any, int, int]]] = []
        self._start_cut: tuple[Any, int, int] | None = None
        self._restored_used: Any = None  # a restored state's "used", until the round is re-packed

    def __next__(self) -> dict[str, Any]:
        while self._rows is None or self._next_row >= len(self._rows):
            if self._rows is not None:  # the round is handed out: the next one starts
                assert self._after is not None
                self._counter += len(self._rows)
                self._start, self._rows, self._next_row = self._after, None, 0
            self._pack_round()
            if not self._rows:
                self._rows = None
                raise StopIteration
            self._next_row, self._skip = self._skip, 0
        row = self._rows[self._order[self._next_row]]
        self._next_row += 1
        return row

    def _pack_round(self) -> None:
        op, parent = self._op, self._parent
        packing = op.new_round()
        self._after = None
        members: list[list[tuple[Any, int, int]]] = [[] for _ in range(op.num_packing_bins)]
        carry = self._carry
        self._start_cut = None if carry is None or not carry[1] else (carry[3], carry[1], len(carry[0]))
        while self._after is None:
            if self._carry is not None:
                pieces, k, before, tag = self._carry
                self._carry = None
            else:
                before = parent.get_state()
                try:
                    element = next(parent)
                except StopIteration:
                    self._after = (parent.get_state(), 0)
                    break
                tag = self._parent_tag()
                try:
                    pieces, k = op.pieces(element), 0
                except (TypeError, KeyError, ValueError) as exc:
                    raise _failed(op, exc) from exc
            while k < len(pieces):
                if not packing.add(pieces[k]):
                    self._carry = (pieces, k, before, tag)
                    self._after = (before, k)
                    break
                members[packing.last_row].append((tag, k, len(pieces)))
                k += 1
        self._members = members
        self._rows = packing.rows()
        self._order = op.row_order(self._rows, self._counter)

    def get_state(self) -> dict[str, Any]:
        if self._rows is not None and self._next_row >= len(self._rows) and self._after is not None:
            start, counter, row = self._after, self._counter + len(self._rows), 0
        else:  # before the round is (re-)packed, the rows to pass over are still to come
            start, counter = self._start, self._counter
            row = self._next_row if self._rows is not None else self._skip
        state = {"parent": start[0], "piece": start[1], "next_row": row, "counter": counter,
                 "packer": self._describe}
        if row or start[1]:
            if self._rows is None:
                used = self._restored_used
            elif row:
                used = self._used_rows(row)
            else:  # the next round starts inside an element: its first pieces are used
                carry = self._carry
                used = None if carry is None else self._used_pieces({carry[3]: (set(range(carry[1])), len(carry[0]))})
            if used is not None:
                state["used"] = used
        return state

    def last_tag(self) -> Any:
        """The engine tags of the records in the row handed out last (a packer over this
        one names its rows' records by them), when each is there whole; else None."""
        if self._rows is None or not self._next_row:
            return None
        members = self._members[self._order[self._next_row - 1]]
        if not members or any(tag is None or count > 1 for tag, _, count in members):
            return None  # a piece of a cut element: its other pieces are in other rows
        return tuple(t for tag, _, _ in members for t in _flat(tag))

    def _used_rows(self, handed: int) -> list[list[Any]] | None:
        """The elements of the round's first ``handed`` rows (in hand-out order), and of
        the element the round starts inside, its pieces of earlier rounds."""
        pieces: dict[Any, tuple[set[int], int]] = {}
        if self._start_cut is not None:
            tag, first, count = self._start_cut
            pieces[tag] = (set(range(first)), count)
        for r in self._order[:handed]:
            for tag, k, count in self._members[r]:
                pieces.setdefault(tag, (set(), count))[0].add(k)
        return self._used_pieces(pieces)

    def _used_pieces(self, pieces: dict[Any, tuple[set[int], int]]) -> list[list[Any]] | None:
        """``tag -> (pieces used, pieces)`` as a state's ``"used"``: an element with all
        its pieces used is used (null); one whose unused pieces are ``a .. b-1`` has its
        rest start at ``a`` row lengths in each feature (to its end when ``b`` is its last
        piece, else ``[a, b]`` row lengths: its first and last pieces were used); the rest
        cuts into the same pieces again. None (no elastic restore from this state) when a
        tag is unknown or an element's unused pieces are not one run (a middle piece
        handed out before both its neighbours)."""
        entries: list[tuple[Any, Any]] = []
        names, caps = self._op.spec.names, self._op.spec.lengths.tolist()
        for tag, (used, count) in pieces.items():
            unused = sorted(set(range(count)) - used)
            if not unused:
                entries.append((tag, None))
            elif unused != list(range(unused[0], unused[-1] + 1)):
                return None
            elif unused[-1] == count - 1:
                entries.append((tag, {name: unused[0] * cap for name, cap in zip(names, caps)}))
            else:
                a, b = unused[0], unused[-1] + 1
                entries.append((tag, {name: [a * cap, b * cap] for name, cap in zip(names, caps)}))
        return used_of(entries)

    def set_state(self, state: Any) -> None:
        state = _check_packer(state, self._op, "a first-fit or best-fit packer")
        self._parent.set_state(state["parent"])
        piece = int(state["piece"])
        self._start, self._counter = (state["parent"], piece), int(state["counter"])
        self._rows, self._next_row, self._after, self._carry = None, 0, None, None
        self._skip = int(state["next_row"])
        self._restored_used = state.get("used")
        if piece:
            element = next(self._parent)
            self._carry = (self._op.pieces(element), piece, state["parent"], self._parent_tag())


class ConcatIterator(_PackIterator):
    """Concat-then-split packing of the parent's elements, one fill at a time.

    A fill is Grain's: elements go into one row until one does not fit whole; with
    ``split_full_length_features=False`` the elements that arrive meanwhile and fill a
    row exactly become rows of their own, handed out after the filled row.
    """

    _op: ConcatThenSplit

    def __init__(self, parent: DatasetIterator, op: ConcatThenSplit) -> None:
        super().__init__(parent, op)
        self._carry: tuple[Any, dict[str, int], Any, Any] | None = None  # (element, offsets, state before, tag)
        # Each ready row's elements: (tag, offsets where its rest starts or None), and
        # the tag of the element the last fill began in (elastic restore).
        self._members: list[list[tuple[Any, Any]]] = []
        self._fill_tag: Any = None
        self._ended = False
        self._ready: list[dict[str, Any]] = []  # the rows of the last fill
        self._handed = 0  # of them, handed out
        self._fill_start: tuple[Any, dict[str, int]] = (None, {})  # where the last fill began

    def __next__(self) -> dict[str, Any]:
        if self._handed >= len(self._ready):
            self._fill()
            if not self._ready:
                raise StopIteration
        row = self._ready[self._handed]
        self._handed += 1
        return row

    def _fill(self) -> None:
        op, parent = self._op, self._parent
        self._fill_start = self._position()
        self._fill_tag = self._carry[3] if self._carry is not None else None
        self._ready, self._handed = [], 0
        row, alone = op.new_row(), []
        inside: list[tuple[Any, Any]] = []
        lonely: list[list[tuple[Any, Any]]] = []
        while True:
            if self._carry is not None:
                element, offsets, before, tag = self._carry
                self._carry = None
            else:
                if self._ended:
                    break
                before = parent.get_state()
                try:
                    element = next(parent)
                except StopIteration:
                    self._ended = True
                    break
                offsets, tag = None, self._parent_tag()
            try:
                if offsets is None and op.passes_through(element):
                    alone.append(op.single_row(element))
                    lonely.append([(tag, None)])
                    continue
                rest = row.add(element, offsets)
            except (TypeError, KeyError, ValueError) as exc:
                raise _failed(op, exc) from exc
            if rest is not None:
                self._carry = (element, rest, before, tag)
                if rest != (offsets or {k: 0 for k in rest}):  # part of it went into the row
                    inside.append((tag, dict(rest)))
                break
            inside.append((tag, None))
        self._ready = ([] if row.empty else [row.finish()]) + alone
        self._members = ([] if row.empty else [inside]) + lonely

    def _position(self) -> tuple[Any, dict[str, int]]:
        """Where the next fill begins: the parent's state before its first element, and
        the offsets into that element (empty: a fresh element)."""
        if self._carry is not None:
            _, offsets, before, _ = self._carry
            return before, dict(offsets)
        return self._parent.get_state(), {}

    def get_state(self) -> dict[str, Any]:
        if self._handed < len(self._ready):  # rows of this fill still to come: fill it again
            parent, offsets = self._fill_start
            state = {"parent": parent, "offsets": dict(offsets), "skip": self._handed,
                     "packer": self._describe}
            entries = [(self._fill_tag, dict(offsets))] if any(offsets.values()) else []
            entries += [m for row in self._members[: self._handed] for m in row]
        else:
            parent, offsets = self._position()
            state = {"parent": parent, "offsets": offsets, "packer": self._describe}
            cut = self._carry is not None and any(offsets.values())
            entries = [(self._carry[3], dict(offsets))] if cut and self._carry is not None else []
        if entries:
            used = used_of(entries)
            if used is not None:
                state["used"] = used
        elif offsets:
            state["used"] = []
        return state

    def set_state(self, state: Any) -> None:
        state = _check_packer(state, self._op, "a concat-then-split packer")
        self._parent.set_state(state["parent"])
        self._carry, self._ended, self._ready, self._handed = None, False, [], 0
        offsets = {str(k): int(v) for k, v in dict(state["offsets"]).items()}
        if offsets:
            self._carry = (next(self._parent), offsets, state["parent"], self._parent_tag())
        skip = int(state.get("skip", 0))  # states without it (none to skip) restore as before
        if skip:
            self._fill()
            self._handed = skip
