"""The ``operations:`` list of a pipeline config: import paths turned into operations.

Each entry is a mapping with one kind key and optional ``args``::

    operations:
      - map: mypkg.decode                  # a function: MapTransform(decode)
      - random_map: mypkg.augment          # f(element, rng, **args)
        args: {max_shift: 2}
      - filter: mypkg.Keep                 # a FilterTransform subclass: Keep(**args)
        args: {min_label: 1}
      - flat_map: mypkg.split
        max_fan_out: 4
      - operation: mypkg.make_op           # any factory returning an operation
        args: {size: 3}
      - batch: {batch_size: 64, drop_remainder: true}   # or: batch: 64
      - first_fit_pack: {length_struct: {tokens: 2048}, num_packing_bins: 16}
      - concat_then_split: {length_struct: {tokens: 2048}, bos_handling: REPLACE_FIRST_TOKEN_WITH_BOS,
                            bos_features: [tokens], bos_token_id: 1}

For ``map``, ``random_map``, ``flat_map`` and ``filter`` the import path names either
a function (wrapped in the kind's transform; ``args`` are bound as keyword arguments
with ``functools.partial``), a subclass of that transform (instantiated with ``args``),
or an instance of it. Everything is resolved and built when the config is loaded, so a
path that does not import, an object of the wrong kind, or arguments the function does
not take fail at load time, naming the entry (``operations.1.map: ...``).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from dataloader.config import checks as check
from dataloader.config.import_path import ImportPathError, resolve_import
from dataloader.operations import (
    Batch,
    BOSHandling,
    FilterTransform,
    FlatMapTransform,
    MapTransform,
    Operation,
    RandomMapTransform,
)
from dataloader.operations.transforms import ELEMENT, GROUP, STREAM, runs_of

_TRANSFORMS: dict[str, type[Operation]] = {
    "map": MapTransform,
    "random_map": RandomMapTransform,
    "flat_map": FlatMapTransform,
    "filter": FilterTransform,
}
# How many leading positional arguments the loader passes (element, and rng).
_POSITIONAL = {"map": 1, "random_map": 2, "flat_map": 1, "filter": 1}


def _declared_kinds() -> dict[str, type]:
    """The operations built by a key of their own: those that declare ``config_key``."""
    from dataloader import operations

    classes = (getattr(operations, name) for name in operations.__all__)
    return {cls.__dict__["config_key"]: cls for cls in classes if isinstance(cls, type) and "config_key" in cls.__dict__}


_PACKERS = _declared_kinds()
_KINDS = (*_TRANSFORMS, "operation", "batch", *_PACKERS)


def _declared(target: Any) -> bool:
    """Whether ``target`` is an operation instance: it declares where it runs."""
    return runs_of(target) in (ELEMENT, GROUP, STREAM)


def _resolve(where: str, path: Any) -> Any:
    check.string(where, path)
    try:
        return resolve_import(path)
    except ImportPathError as error:
        raise check.fail(where, str(error)) from None


def _check_arguments(where: str, fn: Any, path: str, positional: int, args: dict[str, Any]) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have none; they fail when called
        return
    try:
        signature.bind(*([None] * positional), **args)
    except TypeError as error:
        raise check.fail(
            where, f"{path} cannot be called with {positional} element argument(s) and "
            f"args {sorted(args)}: {error}"
        ) from None


def _construct(where: str, factory: Any, path: str, args: dict[str, Any]) -> Any:
    try:
        return factory(**args)
    except (TypeError, ValueError) as error:
        raise check.fail(where, f"{path}(**args) failed: {error}") from error


def _transform(where: str, kind: str, path: str, args: dict[str, Any], extra: dict[str, Any]) -> Operation:
    cls = _TRANSFORMS[kind]
    target = _resolve(check.sub(where, kind), path)
    if (isinstance(target, type) and issubclass(target, Operation)) or isinstance(target, Operation):
        made = target if isinstance(target, Operation) else None
        cls_of: type = type(target) if isinstance(target, Operation) else target
        if not issubclass(cls_of, cls):
            actual = next((k.__name__ for k in _TRANSFORMS.values() if issubclass(cls_of, k)), cls_of.__name__)
            raise check.fail(
                check.sub(where, kind),
                f"{path} is a {actual}, not a {cls.__name__}; list it under the key of its "
                f"own kind, or under 'operation:'",
            )
        if made is not None:
            if args or extra:
                raise check.fail(where, f"{path} is already an operation; it takes no args")
            return made
        return _construct(where, target, path, {**args, **extra})
    if not callable(target):
        raise check.fail(
            check.sub(where, kind),
            f"{path} is a {type(target).__name__}, not a function or a {cls.__name__}",
        )
    _check_arguments(check.sub(where, "args"), target, path, _POSITIONAL[kind], args)
    fn = functools.partial(target, **args) if args else target
    return _construct(where, cls, cls.__name__, {"fn": fn, **extra})


def _batch(where: str, spec: Any) -> Batch:
    if isinstance(spec, int) and not isinstance(spec, bool):
        spec = {"batch_size": spec}
    spec = check.mapping(where, spec)
    check.known_keys(where, spec, ("batch_size", "drop_remainder", "batch_fn"))
    size = check.integer(check.sub(where, "batch_size"), check.get(spec, "batch_size", where=where), low=1)
    drop = check.boolean(check.sub(where, "drop_remainder"), spec.get("drop_remainder", False))
    batch_fn = None
    if spec.get("batch_fn") is not None:
        batch_fn = _resolve(check.sub(where, "batch_fn"), spec["batch_fn"])
        if not callable(batch_fn):
            raise check.fail(check.sub(where, "batch_fn"), f"{spec['batch_fn']} is not callable")
    return Batch(size, drop_remainder=drop, batch_fn=batch_fn)


def _packer(where: str, kind: str, spec: Any) -> Any:
    """An operation built by its own key (a packer, ...) from its arguments (a mapping;
    ``bos_handling`` by its name); each argument its constructor requires must be there."""
    spec = dict(check.mapping(where, spec))
    cls = _PACKERS[kind]
    for name, parameter in inspect.signature(cls).parameters.items():
        if parameter.default is parameter.empty and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            check.get(spec, name, where=where)
    if "bos_handling" in spec:
        names = [h.name for h in BOSHandling]
        name = check.string(check.sub(where, "bos_handling"), spec["bos_handling"], choices=names)
        spec["bos_handling"] = BOSHandling[name]
    return _construct(where, cls, kind, spec)


def _operation(where: str, path: str, args: dict[str, Any]) -> Any:
    target = _resolve(check.sub(where, "operation"), path)
    if _declared(target):
        if args:
            raise check.fail(where, f"{path} is already an operation; it takes no args")
        return target
    if not callable(target):
        raise check.fail(check.sub(where, "operation"), f"{path} is a {type(target).__name__}, not callable")
    made = _construct(where, target, path, args)
    if not _declared(made):
        raise check.fail(
            check.sub(where, "operation"),
            f"{path}(**args) returned a {type(made).__name__}, not an operation (MapTransform, "
            f"RandomMapTransform, FlatMapTransform, FilterTransform, Batch or a packer)",
        )
    return made


def build_operation(where: str, entry: Any) -> Any:
    """Builds the operation of one ``operations:`` entry; ``where`` is e.g. ``operations.2``."""
    entry = check.mapping(where, entry)
    kinds = [key for key in entry if key in _KINDS]
    if len(kinds) != 1:
        raise check.fail(
            where, f"expected exactly one of {', '.join(_KINDS)} as a key, got {sorted(entry) or 'none'}"
        )
    kind = kinds[0]
    if kind in _PACKERS:
        check.known_keys(where, entry, [kind])
        return _packer(check.sub(where, kind), kind, entry[kind])
    allowed = [kind] if kind == "batch" else [kind, "args"] + (["max_fan_out"] if kind == "flat_map" else [])
    check.known_keys(where, entry, allowed)
    if kind == "batch":
        return _batch(check.sub(where, "batch"), entry["batch"])
    args = check.mapping(check.sub(where, "args"), entry.get("args"))
    if kind == "operation":
        return _operation(where, entry[kind], args)
    extra = {}
    if "max_fan_out" in entry:
        extra["max_fan_out"] = check.integer(check.sub(where, "max_fan_out"), entry["max_fan_out"], low=1)
    return _transform(where, kind, entry[kind], args, extra)


def build_operations(where: str, entries: Any) -> list[Any]:
    """Builds every entry of the ``operations:`` list, in order."""
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise check.fail(where, f"expected a list of operations, got {entries!r}")
    built = [build_operation(check.sub(where, i), entry) for i, entry in enumerate(entries)]
    batches = [i for i, op in enumerate(built) if op.runs == GROUP]
    if len(batches) > 1:
        raise check.fail(where, f"at most one batch is allowed, found batches at {batches}")
    return built
