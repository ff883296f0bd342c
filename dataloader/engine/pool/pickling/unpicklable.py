"""Which object of a pipeline cannot travel to a worker, named by its path.

When a pipeline fails to pickle or to unpickle, :func:`find_unpicklable` walks down
from the part that fails (an operation, the data source) through what that object is
made of (attributes, items, a function's closure and globals, a partial's arguments)
to the innermost object that fails on its own, and returns its path:
``operations[2].fn.__self__._tokenizer._chat_template``. Only the objects on the
failing branch are walked; each child is checked by a round trip of its own.

Example:
    >>> import pickle, threading
    >>> class Holder:
    ...     def __init__(self):
    ...         self.lock = threading.Lock()
    >>> def round_trip(obj):
    ...     pickle.loads(pickle.dumps(obj))
    >>> find_unpicklable([("operations[0]", {"ok": 1, "holder": Holder()})], round_trip)[0]
    "operations[0]['holder'].lock"
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

# Children looked at per object, and how deep: a failing object is found in a few levels.
MAX_CHILDREN = 10_000
MAX_DEPTH = 64


class Culprit(NamedTuple):
    """The innermost object that fails: its path, itself, its error, and the part of
    the pipeline it belongs to (the path of that part)."""

    path: str
    obj: Any
    error: BaseException
    part: str


def find_unpicklable(parts: list[tuple[str, Any]], round_trip: Callable[[Any], None]) -> Culprit | None:
    """The innermost object of ``parts`` whose ``round_trip`` raises; None if every part
    round-trips.

    Args:
        parts: ``(path, object)`` pairs to search, in order.
        round_trip: pickles and unpickles one object, raising what fails.
    """
    for path, obj in parts:
        error = _fails(obj, round_trip)
        if error is not None:
            where, what, why = _descend(path, obj, error, round_trip, {id(obj)}, 0)
            return Culprit(where, what, why, path)
    return None


def _fails(obj: Any, round_trip: Callable[[Any], None]) -> BaseException | None:
    try:
        round_trip(obj)
    except Exception as exc:
        return exc
    return None


def _descend(
    path: str, obj: Any, error: BaseException, round_trip: Callable[[Any], None], seen: set[int], depth: int
) -> tuple[str, Any, BaseException]:
    if depth < MAX_DEPTH:
        for count, (step, child) in enumerate(children(obj)):
            if count >= MAX_CHILDREN:
                break
            if id(child) in seen or isinstance(child, (type, types.ModuleType)):
                continue
            seen.add(id(child))
            child_error = _fails(child, round_trip)
            if child_error is not None:
                return _descend(path + step, child, child_error, round_trip, seen, depth + 1)
    return path, obj, error


def children(obj: Any) -> Iterator[tuple[str, Any]]:
    """What ``obj`` is made of, each with the step that reaches it from ``obj``."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield f"[{key!r}]", value
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield f"[{i}]", value
    elif isinstance(obj, (set, frozenset)):
        for value in obj:
            yield f" item {value!r:.40}", value
    elif isinstance(obj, functools.partial):
        yield ".func", obj.func
        for i, value in enumerate(obj.args):
            yield f".args[{i}]", value
        for key, value in obj.keywords.items():
            yield f".keywords[{key!r}]", value
    elif isinstance(obj, types.MethodType):
        yield ".__self__", obj.__self__
        yield ".__func__", obj.__func__
    elif isinstance(obj, types.FunctionType):
        yield from _function_parts(obj)
    elif not isinstance(obj, (str, bytes, bytearray, int, float, complex, bool, type(None))):
        yield from _state_parts(obj)


def _function_parts(fn: types.FunctionType) -> Iterator[tuple[str, Any]]:
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        yield f".__closure__[{name!r}]", value
    for name in fn.__code__.co_names:
        if name in fn.__globals__:
            yield f".__globals__[{name!r}]", fn.__globals__[name]
    for i, value in enumerate(fn.__defaults__ or ()):
        yield f".__defaults__[{i}]", value
    for key, value in (fn.__kwdefaults__ or {}).items():
        yield f".__kwdefaults__[{key!r}]", value


def _state_parts(obj: Any) -> Iterator[tuple[str, Any]]:
    try:
        state = obj.__getstate__()
    except Exception:  # a __getstate__ that refuses: the object itself is the culprit
        return
    slots: Any = None
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
        state, slots = state  # (dict or None, slots) for a class with __slots__
    if isinstance(state, dict):
        for key, value in state.items():
            yield (f".{key}" if isinstance(key, str) and key.isidentifier() else f"[{key!r}]"), value
    elif state is not None:
        yield ".__getstate__()", state
    for key, value in (slots or {}).items():
        yield f".{key}", value
