"""How a pipeline travels to worker processes: cloudpickle, checked and made to unpickle.

cloudpickle pickles nearly anything, but some objects pickle and then fail to *unpickle*:
the default reduction of a class whose ``__new__`` takes arguments (a compiled
``jinja2.Template``, held by Hugging Face and torchtitan tokenizers for their chat
templates) calls ``cls.__new__(cls)`` in the worker, which raises. Such a failure used to
surface as a worker that could not start, naming no object. Here:

1. **Objects are sent in a form that unpickles.** :class:`PlanPickler` rebuilds an object
   whose class has a ``__new__`` with required arguments, and no ``__reduce__`` or
   ``__getnewargs__`` of its own, from a bare instance and its state (what ``copy.copy``
   and the default reduction would do, minus the ``__new__`` call), which is the whole
   object when the class keeps its state in ``__dict__``/``__slots__``. Other offenders take a
   reducer registered with :func:`register_reducer`, which applies to what granary sends
   to its workers only (``copyreg.pickle`` registrations are honoured too, and apply
   everywhere in the process).
2. **The pickle is checked before any worker starts.** :func:`dumps_checked` pickles and
   unpickles (in the training process, once, when the loader is built) and, when
   unpickling fails, finds the innermost object that fails on its own and names it by its
   path from the part of the pipeline that holds it (``operations[2].fn._tokenizer.
   _chat_template``).
3. **The modules the objects come from are recorded**, so that the fork server imports
   them once before it forks workers (:func:`dataloader.engine.pool.zygote.preload_modules`).

Example:
    >>> data = dumps_checked({"scale": 2.0}, "data_source")
    >>> import pickle; pickle.loads(data)
    {'scale': 2.0}
"""

from __future__ import annotations

import inspect
import io
import pickle
import sys
import types
from collections import ChainMap
from collections.abc import Callable
from typing import Any

import cloudpickle

from dataloader.engine.pool.pickling.unpicklable import find_unpicklable

__all__ = ["PickledPlan", "PlanPickler", "bare_instance", "dumps_checked", "register_reducer", "round_trip"]

# Reducers registered with register_reducer: type -> obj -> reduce tuple.
_REDUCERS: dict[type, Callable[[Any], Any]] = {}


def register_reducer(cls: type, reducer: Callable[[Any], Any] | None) -> None:
    """How granary sends objects of exactly ``cls`` to its worker processes.

    ``reducer(obj)`` returns what ``__reduce__`` would: ``(callable, args)`` or ``(callable,
    args, state)``, the callable importable in the worker (a module-level function), so
    that ``callable(*args)`` (then the state) rebuilds the object there. It applies to
    the pipelines granary pickles for its workers, not to other pickling in the process.
    ``reducer=None`` removes the registration.

    Example:
        >>> import re
        >>> register_reducer(re.Pattern, lambda p: (re.compile, (p.pattern, p.flags)))
        >>> register_reducer(re.Pattern, None)
    """
    if not isinstance(cls, type):
        raise TypeError(f"register_reducer needs a class, got {cls!r}; pass type(obj)")
    if reducer is None:
        _REDUCERS.pop(cls, None)
        return
    if not callable(reducer):
        raise TypeError(f"register_reducer({cls.__qualname__}, ...) needs a callable reducer, got {reducer!r}")
    _REDUCERS[cls] = reducer


def bare_instance(cls: type) -> Any:
    """An instance of ``cls`` made without calling its ``__new__`` or ``__init__``: the
    rebuilt object's state follows (see :class:`PlanPickler`)."""
    return object.__new__(cls)


# type -> whether it is rebuilt from a bare instance (computed once per type).
_BARE: dict[type, bool] = {}


def _rebuilt_bare(cls: type) -> bool:
    """Whether the default reduction of ``cls`` would call a ``__new__`` that needs
    arguments it does not get, and a bare instance can stand in for it."""
    known = _BARE.get(cls)
    if known is not None:
        return known
    answer = False
    new = cls.__new__
    if (
        new is not object.__new__
        and cls.__reduce_ex__ is object.__reduce_ex__
        and cls.__reduce__ is object.__reduce__
        and not hasattr(cls, "__getnewargs_ex__")
        and not hasattr(cls, "__getnewargs__")
    ):
        try:
            params = list(inspect.signature(new).parameters.values())[1:]
        except (TypeError, ValueError):  # a builtin __new__ without a signature
            params = []
        required = [
            p for p in params
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if required:
            try:
                object.__new__(cls)  # refused for a class laid out over a builtin (tuple, ...)
            except TypeError:
                pass
            else:
                answer = True
    _BARE[cls] = answer
    return answer


# cloudpickle writes "<dynamic-code>" as the file of every code object it sends by value
# (the functions of a script's __main__, lambdas), so that its bytes do not depend on
# where the code was written; a worker's traceback then names no file. What goes to the
# workers keeps each code object's own file name, so the traceback the training process
# gets names the user's file and line (and shows the line where the worker can read the
# file). The name is a function of the code alone: the bytes stay the same from run to run.
_CLOUDPICKLE_CODE = cloudpickle.Pickler.dispatch_table[types.CodeType]


def _reduce_code(code: types.CodeType) -> tuple[Any, tuple[Any, ...]]:
    make, args = _CLOUDPICKLE_CODE(code)  # cloudpickle's recipe, nested code included
    return _code_in_file, (make, args, code.co_filename)


def _code_in_file(make: Any, args: tuple[Any, ...], filename: str) -> types.CodeType:
    code: types.CodeType = make(*args)
    return code.replace(co_filename=filename)


class PlanPickler(cloudpickle.Pickler):
    """cloudpickle, plus the reducers of :func:`register_reducer`, the bare-instance rule
    for classes whose ``__new__`` needs arguments, code that keeps its file name (for the
    workers' tracebacks), and a record of the modules the pickled classes, functions and
    instances come from (:attr:`modules`)."""

    dispatch_table = ChainMap(_REDUCERS, {types.CodeType: _reduce_code}, cloudpickle.Pickler.dispatch_table)

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.modules: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, type):
            self.modules.add(obj.__module__)
        elif isinstance(obj, types.ModuleType):
            self.modules.add(obj.__name__)
        elif isinstance(obj, (types.FunctionType, types.BuiltinFunctionType)):
            if obj.__module__ is not None:
                self.modules.add(obj.__module__)
        else:
            cls = type(obj)
            self.modules.add(cls.__module__)
            if cls not in _REDUCERS and _rebuilt_bare(cls):
                state = obj.__getstate__()
                return (bare_instance, (cls,)) if state is None else (bare_instance, (cls,), state)
        return super().reducer_override(obj)


class PickledPlan(bytes):
    """A pipeline's pickle (it *is* the bytes), with the modules its objects come from."""

    modules: tuple[str, ...]


def _dumps(obj: Any) -> tuple[bytes, set[str]]:
    buffer = io.BytesIO()
    pickler = PlanPickler(buffer)
    pickler.dump(obj)
    return buffer.getvalue(), pickler.modules


def dumps_checked(obj: Any, name: str, parts: list[tuple[str, Any, str]] | None = None) -> PickledPlan:
    """``obj`` pickled for the workers, after checking that it unpickles here.

    Args:
        obj: what to send (a plan, an operation, a ``worker_init_fn``).
        name: what ``obj`` is, for the messages (``"the pipeline"``, ``"worker_init_fn"``).
        parts: ``(path, part, what it is)`` triples that make up ``obj``, searched in
            order for the object at fault (``("operations[2]", op, "operation
            MapTransform(f)")``); None: ``obj`` is searched as ``name``.

    Raises:
        TypeError: an object cannot be pickled, or cannot be unpickled; the message names
            it by its path and says what to do.
    """
    candidates = parts if parts is not None else [(name, obj, "")]
    loading = False
    try:
        data, modules = _dumps(obj)
        loading = True
        pickle.loads(data)
    except Exception as exc:
        where, what, error = _culprit(candidates, name, obj, exc)
        if loading:
            why = (f"pickles but cannot be unpickled, so no worker could start: "
                   f"{type(error).__name__}: {error}. Give its class a __reduce__ (or "
                   f"__getnewargs__) that rebuilds it, register one for granary's workers "
                   f"with dataloader.register_reducer({type(what).__qualname__}, ...), or "
                   f"build it in the worker (lazily, on first use)")
        else:
            why = (f"cannot be sent to worker processes: {type(error).__name__}: {error}; "
                   f"make it picklable (open files and locks lazily)")
        raise TypeError(f"{where} {why}; or use worker_count=0") from error
    plan = PickledPlan(data)
    plan.modules = tuple(sorted(m for m in modules if m in sys.modules))
    return plan


def _culprit(
    parts: list[tuple[str, Any, str]], name: str, obj: Any, error: BaseException
) -> tuple[str, Any, BaseException]:
    """Where the failure is: the innermost failing object's path and what it is (with
    the part of the pipeline it is in), the object and its own error."""
    found = find_unpicklable([(path, part) for path, part, _ in parts], round_trip)
    if found is None:  # only the whole fails (objects shared between parts): name the whole
        return f"{name} ({_describe(obj)})", obj, error
    note = {path: what for path, _, what in parts}[found.part]
    where = f"{found.path} ({_describe(found.obj)})" + (f", in {note}," if note else "")
    return where, found.obj, found.error


def round_trip(obj: Any) -> None:
    """Pickles ``obj`` as the workers get it and unpickles it, raising what fails."""
    pickle.loads(_dumps(obj)[0])


def _describe(obj: Any) -> str:
    cls = type(obj)
    text = repr(obj)
    if len(text) > 120:
        text = text[:117] + "..."
    return f"a {cls.__module__}.{cls.__qualname__}: {text}"
