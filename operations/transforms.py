"""Element-wise operations: map, random map, flat map and filter.

Each operation works two ways, as users of Grain expect:

* by subclassing and overriding the method (``map``, ``random_map``, ``flat_map``,
  ``filter``), or
* by wrapping a plain function: ``MapTransform(lambda x: x + 1)``.

Example:
    >>> double = MapTransform(lambda x: 2 * x)
    >>> double.map(3)
    6
    >>> class Even(FilterTransform):
    ...     def filter(self, element):
    ...         return element % 2 == 0
    >>> Even().filter(4)
    True

Operations must be picklable (with cloudpickle, so lambdas and local functions work)
because the worker pool sends them to child processes. They should be pure functions of
their input (and, for random maps, of the generator they are given): the loader's
output is then a pure function of the data, the sampler and the operations.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

# Where an operation runs (``Operation.runs``, ``Batch.runs``, the packers' ``runs``): the
# loader, the YAML config, ``apply_transformations`` and the stage builder read it instead
# of testing for classes.
ELEMENT = "element"  # on each element alone, by position: in any process, in any order
GROUP = "batch"  # on a group of consecutive elements (``Batch``)
STREAM = "stream"  # on the ordered stream: its output depends on what came before (packers)
# A STREAM operation also names the stage that runs it, ``stage = "module:Class"`` (a
# ``DatasetIterator`` made as ``Class(parent, op)``): a name, because operations/ never
# imports the engine; the engine imports it when it first runs one. A class that sets
# ``config_key`` in its own body (and is exported by ``dataloader.operations``) is built by
# that key in a YAML config's ``operations:``, with the entry's mapping as its arguments.

# What an element operation's function returns (``Operation.returns``).
ONE = "one"  # the new element
KEEP = "keep"  # whether to keep the element
MANY = "many"  # a sequence of elements that replace it


@runtime_checkable
class Declared(Protocol):
    """What every operation declares: where it runs (``ELEMENT``, ``GROUP``, ``STREAM``).

    An ``ELEMENT`` operation (an :class:`Operation`) also declares ``returns``,
    ``needs_seed``, ``needs_index`` and ``reshapes``; a ``STREAM`` one its ``stage``.
    """

    runs: str


def runs_of(op: Any) -> str | None:
    """Where ``op`` runs, or None when it is no operation (a function, a class, ...)."""
    return op.runs if isinstance(op, Declared) and not isinstance(op, type) else None


def resolve_seed(op: Any, default: int | None, where: str = "") -> int | None:
    """The seed of ``op``'s per-element generators: its ``rng_seed``, else ``default``.

    ``None`` for an operation that does not declare ``needs_seed``; the one rule every
    place that runs a random map follows.

    The seed keys a Philox generator, so it must be an integer in ``[0, 2**64)``; it is
    checked here, where the pipeline is built, rather than in a worker.

    Raises:
        ValueError: ``op`` needs a seed and neither it nor ``default`` has one, or the
            seed is not an integer in ``[0, 2**64)``.
    """
    if not op.needs_seed:
        return None
    seed = op.rng_seed if op.rng_seed is not None else default
    if seed is None:
        raise ValueError(
            f"{where}{op.name} is a random map but the sampler has no seed; pass seed=... to "
            f"the sampler (or give the operation an rng_seed) so augmentations are reproducible"
        )
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
        raise ValueError(
            f"{where}{op.name} has the seed {seed!r}; a random map's seed (its rng_seed, else "
            f"the sampler's) must be an integer in [0, 2**64)"
        )
    return int(seed)


def refuse_class(op: Any, where: str) -> None:
    """A TypeError when ``op`` is a class, not an operation (``operations=[Batch]``).

    A class has the class attributes an operation declares (``runs``, ...), so without
    this check it is taken for one and fails later on an attribute only an instance
    has. The message shows the call that makes an instance, with the arguments the
    class's constructor requires.

    Example:
        >>> refuse_class(MapTransform, "operations[0]")
        Traceback (most recent call last):
        TypeError: operations[0] is the class MapTransform, not an operation; pass an instance, MapTransform(your_function)
    """
    if not isinstance(op, type):
        return
    if issubclass(op, Operation) and not op.overrides_method():
        call = f"{op.__name__}(your_function)"  # a wrapper class: it needs the function
    else:
        try:
            params = inspect.signature(op).parameters.values()
        except (TypeError, ValueError):  # a builtin without a signature: no arguments shown
            params = []  # type: ignore[assignment]
        required = [
            p.name for p in params
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        call = f"{op.__name__}({', '.join(f'{name}=...' for name in required)})"
    raise TypeError(f"{where} is the class {op.__name__}, not an operation; pass an instance, {call}")


def _callable_name(fn: Any) -> str:
    """A short, stable name for a function-like object (used in state and errors)."""
    inner = getattr(fn, "func", None)  # functools.partial
    if inner is not None and callable(inner):
        return _callable_name(inner)
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


class Operation:
    """Base of every operation; subclasses define the per-element method.

    ``method_name`` names the method a subclass overrides; a function given to the
    constructor replaces it.

    Each subclass declares how it is run, so that the code that runs operations reads
    these attributes instead of testing for classes:

    Attributes:
        runs: where it runs; every ``Operation`` runs on single elements (``ELEMENT``).
        returns: what its function returns: ``ONE`` element, ``KEEP`` (a truth value),
            or ``MANY`` elements (a sequence).
        needs_seed: its function takes a ``numpy.random.Generator`` after the element,
            keyed by a seed (see :func:`resolve_seed`) and the element's position.
        needs_index: its function takes the element's index before the element.
    """

    method_name = ""
    runs = ELEMENT
    returns = ONE
    needs_seed = False
    needs_index = False
    _fn: Callable[..., Any] | None = None

    def __init__(self, fn: Callable[..., Any] | None = None) -> None:
        kind = type(self).__name__
        if fn is not None and not callable(fn):
            raise TypeError(
                f"{kind} needs a callable, got {fn!r} ({type(fn).__name__}); pass a function "
                f"or subclass {kind} and override {self.method_name}()"
            )
        if fn is None and not self.overrides_method():
            raise TypeError(
                f"{kind} was given no function and does not override {self.method_name}(); "
                f"pass a function, e.g. {kind}(lambda x: ...), or subclass it"
            )
        self._fn = fn

    @classmethod
    def overrides_method(cls) -> bool:
        """Whether this class overrides its kind's method (then it needs no function)."""
        base = next(c for c in cls.__mro__ if c.__dict__.get("method_name") == cls.method_name)
        return getattr(cls, cls.method_name) is not getattr(base, cls.method_name)

    @property
    def name(self) -> str:
        """The operation's name in states and error messages, e.g. ``MapTransform(decode)``."""
        if self._fn is not None:
            return f"{type(self).__name__}({_callable_name(self._fn)})"
        return type(self).__qualname__

    def __repr__(self) -> str:
        return self.name

    @property
    def reshapes(self) -> bool:
        """Whether it changes the number of elements (a filter, a flat map)."""
        return self.returns != ONE

    def element_fn(self) -> Callable[..., Any]:
        """The callable to apply per element.

        The wrapped function itself when one was given (saving a method call per
        element on the hot path), else the overridden method.
        """
        if self._fn is not None and not self.overrides_method():
            return self._fn
        return getattr(self, self.method_name)

    def _missing(self) -> Any:
        raise NotImplementedError(
            f"{type(self).__name__}.{self.method_name}() is not defined; pass a function "
            f"or override it"
        )


class MapTransform(Operation):
    """Applies ``map(element) -> element`` to every element."""

    method_name = "map"

    def map(self, element: Any) -> Any:
        if self._fn is None:
            return self._missing()
        return self._fn(element)


class RandomMapTransform(Operation):
    """Applies ``random_map(element, rng) -> element`` with a per-element generator.

    The ``rng`` is a ``numpy.random.Generator`` derived from the seed, the element's
    global position and this operation's place in the pipeline, so the result does not
    depend on worker count, prefetch depth, host count or a restore. The seed is
    ``rng_seed`` when it is set (on an instance or a subclass), else the sampler's.
    """

    method_name = "random_map"
    needs_seed = True
    rng_seed: int | None = None

    def random_map(self, element: Any, rng: np.random.Generator) -> Any:
        if self._fn is None:
            return self._missing()
        return self._fn(element, rng)


class FlatMapTransform(Operation):
    """Replaces each element by the elements of ``flat_map(element) -> Sequence``.

    Args:
        fn: the function, unless a subclass overrides ``flat_map``.
        max_fan_out: the most elements one input may produce (``None``: no limit). An
            element producing more raises an error naming the operation and the counts.
            Subclasses may set it as a class attribute instead.
    """

    method_name = "flat_map"
    returns = MANY
    max_fan_out: int | None = None

    def __init__(
        self, fn: Callable[[Any], Sequence[Any]] | None = None, *, max_fan_out: int | None = None
    ) -> None:
        super().__init__(fn)
        if max_fan_out is not None:
            self.max_fan_out = max_fan_out
        limit = self.max_fan_out
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(
                f"max_fan_out must be a positive integer or None, got {limit!r}; pass the "
                f"largest number of elements one input can produce"
            )

    def flat_map(self, element: Any) -> Sequence[Any]:
        if self._fn is None:
            return self._missing()
        return self._fn(element)

    def checked_flat_map(self, element: Any) -> list[Any]:
        """``flat_map`` as a list, with ``max_fan_out`` enforced."""
        out = list(self.flat_map(element))
        if self.max_fan_out is not None and len(out) > self.max_fan_out:
            raise ValueError(
                f"{self.name} produced {len(out)} elements from one input, more than "
                f"max_fan_out={self.max_fan_out}; raise max_fan_out or split the input"
            )
        return out


class MapWithIndexTransform(Operation):
    """Applies ``map_with_index(index, element) -> element`` to every element.

    ``index`` is the element's index in the dataset (``MapDataset``) or in the stream the
    call is chained on (``IterDataset``: 0, 1, 2, ... of the elements that reach it), as in
    Grain.
    """

    method_name = "map_with_index"
    needs_index = True

    def map_with_index(self, index: int, element: Any) -> Any:
        if self._fn is None:
            return self._missing()
        return self._fn(index, element)


class FilterTransform(Operation):
    """Keeps the elements for which ``filter(element)`` is true."""

    method_name = "filter"
    returns = KEEP

    def filter(self, element: Any) -> bool:
        if self._fn is None:
            return self._missing()
        return bool(self._fn(element))
