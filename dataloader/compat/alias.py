"""``import grain`` gives granary: a finder on ``sys.meta_path`` and lazy alias modules.

:func:`install_grain_alias` puts a :class:`GrainAliasFinder` first on
``sys.meta_path``. It answers for ``grain`` and every module path of
:data:`~dataloader.compat.modules.MODULES` with a :class:`GrainAliasModule`: an empty
package whose names resolve on first use (``__getattr__``) to granary's objects, so
``grain.python.MapDataset is dataloader.MapDataset`` and nothing of granary is imported
before a name is used. A name Grain has and granary lacks raises an ``AttributeError``
(``ImportError`` in ``from grain.x import name``) that says so.

Every alias module is a package (``__path__ == []``): then ``from grain.python import
Missing`` asks this finder for ``grain.python.Missing`` before Python gives up, and the
finder raises the same clear message instead of Python's "cannot import name".

The alias reaches child processes through the environment: installing it sets
``GRANARY_GRAIN_ALIAS`` (``1``, or ``force``), and ``import dataloader`` installs it
where the variable is set, which every worker and fork server does first.

A real Grain is never shadowed unless asked: :func:`install_grain_alias` raises
:class:`RealGrainError` when ``grain`` is importable from ``sys.path``;
``force=True`` shadows it (and hides Grain modules already imported, until
:func:`uninstall_grain_alias`). Through the environment variable (``=1``) a real
Grain gets a ``RuntimeWarning`` instead, so that ``import dataloader`` never fails
because of what else is installed; that check waits for the first ``import grain``,
when ``sys.path`` is the program's own.

The install puts a startup hook in site-packages, ``granary-grain-alias.pth`` (written
by ``setup.py``): where the variable is set, Python imports ``dataloader`` as it starts,
so ``GRANARY_GRAIN_ALIAS=1 python train.py`` runs a ``train.py`` whose first line is
``import grain``. Unset, the hook reads one variable and imports nothing.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any

from dataloader.compat.modules import DIFFERENCES, MODULES, submodules
from dataloader.errors import GranaryError

ENV_VAR = "GRANARY_GRAIN_ALIAS"
_ENV_VALUES = {"": None, "0": None, "1": False, "force": True}  # value -> force (None: off)
_GUIDE = "docs/migrating-from-grain.md (Migrating from Grain)"
_DOCS = "docs/grain-differences.md (Differences from Grain)"


class RealGrainError(GranaryError, ImportError):
    """A real ``grain`` is importable, and the alias was not asked to shadow it."""


def missing_message(module: str, name: str) -> str:
    """What a Grain name granary cannot give says: which name, why, and where to look.

    A name granary leaves out on purpose (:data:`~dataloader.compat.modules.DIFFERENCES`)
    gets its reason and what to use instead.
    """
    if name in DIFFERENCES and (name in MODULES[module].names or module.startswith("grain._src")):
        why, instead = DIFFERENCES[name]
        return (f"granary does not provide Grain's {module}.{name}: {why}. Use {instead} "
                f"(see {_DOCS})")
    if name in MODULES[module].names:
        return (f"granary does not provide Grain's {module}.{name}: the grain alias maps Grain's "
                f"names to granary's where granary has them, and this one has no counterpart; "
                f"see {_GUIDE} for what is mapped, or write this step with granary's API")
    return (f"{module}.{name} is neither a name of Grain's {module} nor one granary provides "
            f"under it; check the spelling (dir({module}) lists its names; see {_GUIDE})")


def resolve(module: str, name: str) -> Any:
    """Granary's object for Grain's ``module.name``, by :data:`MODULES`' rules.

    Raises:
        AttributeError: granary has no such name (the message says which and why).
        ImportError: a granary module that has the name failed to import (a missing
            dependency such as Orbax): that error, unchanged.
    """
    entry = MODULES[module]
    candidates = [*entry.renamed.get(name, ()), *(f"{room}:{name}" for room in entry.search)]
    for candidate in candidates:
        room, attribute = candidate.split(":")
        try:
            home = importlib.import_module(room)
        except ModuleNotFoundError as exc:
            if exc.name == room:  # a room granary does not have (yet): try the next
                continue
            raise
        value = getattr(home, attribute, None)
        # A granary subpackage of that spelling (dl.samplers) is not Grain's name.
        if value is not None and not isinstance(value, types.ModuleType):
            return value
    raise AttributeError(missing_message(module, name))


class GrainAliasModule(types.ModuleType):
    """A Grain module path whose names are granary's, resolved on first use."""

    __path__: list[str]

    def __getattr__(self, name: str) -> Any:
        module = self.__name__
        if name == "__all__":  # for `from grain.x import *`: what resolves now
            return [n for n in MODULES[module].names if _resolves(module, n)]
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        if name in submodules(module):
            return importlib.import_module(f"{module}.{name}")
        value = resolve(module, name)
        setattr(self, name, value)  # later lookups skip this method; misses are asked again
        return value

    def __dir__(self) -> list[str]:
        return sorted({*self.__dict__, *MODULES[self.__name__].names, *submodules(self.__name__)})

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # By name, as pickle treats modules: a function pickled by value (a lambda in
        # __main__) that refers to `grain` reaches a worker, which imports it there.
        # cloudpickle dispatches on the exact type ModuleType, so a subclass needs this.
        return importlib.import_module, (self.__name__,)


def _resolves(module: str, name: str) -> bool:
    try:
        resolve(module, name)
    except AttributeError:
        return False
    return True


class GrainAliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and makes the alias modules; answers nothing outside ``grain``.

    Args:
        check_real_first: installed from the environment (``GRANARY_GRAIN_ALIAS=1``),
            the finder asks whether a real Grain is importable when ``grain`` is first
            imported rather than when it is installed: ``sys.path`` is then what the
            program made it (at interpreter start, where the ``.pth`` hook installs it,
            the script's folder is not on it yet). A real Grain found then is imported,
            with a ``RuntimeWarning``, and the alias uninstalls itself.
    """

    def __init__(self, check_real_first: bool = False) -> None:
        self._check_real = check_real_first
        self._checking = False  # True while the check asks the import system itself

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if self._checking or fullname.partition(".")[0] != "grain":
            return None
        if self._check_real:
            self._check_real = False
            real = self._real_spec(fullname)
            if real is not None:
                return real
        if fullname in MODULES:
            return importlib.machinery.ModuleSpec(fullname, self, origin="granary", is_package=True)
        parent, _, name = fullname.rpartition(".")
        if parent in MODULES:
            # `from grain.python import Missing` after the attribute was not found, or a
            # Grain module path granary does not map: say which, not "No module named".
            raise ImportError(missing_message(parent, name), name=fullname)
        return None

    def _real_spec(self, fullname: str) -> importlib.machinery.ModuleSpec | None:
        """The spec of a real Grain's ``fullname`` when one is importable (the alias is
        then uninstalled, with a warning), else None."""
        self._checking = True
        try:
            real = _real_grain()
        finally:
            self._checking = False
        if real is None:
            return None
        warnings.warn(
            f"{ENV_VAR}={os.environ.get(ENV_VAR)} is ignored: a real Grain is installed ({real}); "
            f"the grain alias does not shadow it. Use Grain as it is, or set {ENV_VAR}=force to "
            f"make `import grain` give granary",
            RuntimeWarning,
            stacklevel=3,  # the `import grain` line: warnings skips the import system's frames
        )
        # The import system stops at the spec returned here, so leaving sys.meta_path
        # while it walks that list skips nothing.
        uninstall_grain_alias()
        return importlib.util.find_spec(fullname)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return GrainAliasModule(spec.name, f"Grain's {spec.name}, on granary (dataloader.compat)")

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: every name resolves on first use."""


class _Installed:
    """What install changed, so that uninstall puts it back."""

    def __init__(self, finder: GrainAliasFinder, hidden: dict[str, types.ModuleType], env: str | None) -> None:
        self.finder = finder
        self.hidden = hidden  # real Grain modules taken out of sys.modules by force=True
        self.env = env  # the variable's value before install


_installed: _Installed | None = None


def _real_grain() -> str | None:
    """Where a real Grain would be imported from, or None."""
    loaded = sys.modules.get("grain")
    if loaded is not None and not isinstance(loaded, GrainAliasModule):
        return getattr(loaded, "__file__", None) or repr(loaded)
    try:
        spec = importlib.util.find_spec("grain")
    except (ImportError, ValueError):
        return None
    # A folder named grain/ without __init__.py (a namespace package, often a data
    # folder in the working directory) is not Grain.
    if spec is None or spec.origin in (None, "namespace"):
        return None
    return spec.origin


# GRANARY_PERMUTATION before install_grain_alias(permutation=...) set it (None: unset).
_UNSET: Any = object()
_permutation_before: Any = _UNSET


def is_installed() -> bool:
    """Whether ``import grain`` gives granary in this process."""
    return _installed is not None


def install_grain_alias(force: bool = False, *, permutation: str | None = None) -> None:
    """Makes ``import grain`` (and its submodules) give granary, here and in workers.

    Idempotent. Sets ``GRANARY_GRAIN_ALIAS`` in ``os.environ`` so that child processes
    started from now on (the loader's workers and fork server) install it too.

    Args:
        force: shadow a real Grain that is installed (its modules already imported are
            hidden from ``sys.modules`` until :func:`uninstall_grain_alias`).
        permutation: ``"grain"`` makes every ``MapDataset.shuffle`` built from now on
            (that names no order) read Grain's order, element for element, so a run moved
            from Grain sees Grain's rows; ``"granary"`` our default order. It sets
            ``GRANARY_PERMUTATION`` (put back by :func:`uninstall_grain_alias`); ``None``
            leaves it as it is.

    Raises:
        RealGrainError: ``grain`` is importable and ``force`` is False.

    Example:
        >>> from dataloader.compat import install_grain_alias, uninstall_grain_alias
        >>> install_grain_alias()  # doctest: +SKIP
        >>> import grain.python as grain  # doctest: +SKIP
    """
    global _permutation_before
    if permutation is not None:
        from dataloader.samplers.index_sampler import PERMUTATION_ENV, choose_permutation

        choose_permutation(permutation)  # refuses an unknown order before changing anything
        if _permutation_before is _UNSET:
            _permutation_before = os.environ.get(PERMUTATION_ENV)
        os.environ[PERMUTATION_ENV] = permutation
    if _installed is not None:
        return
    real = _real_grain()
    if real is not None and not force:
        raise RealGrainError(
            f"a real Grain is installed ({real}); the grain alias does not shadow it. Use Grain "
            f"as it is, or call install_grain_alias(force=True) (GRANARY_GRAIN_ALIAS=force) to "
            f"make `import grain` give granary in this process and its workers"
        )
    _install(GrainAliasFinder(), force)


def _install(finder: GrainAliasFinder, force: bool) -> None:
    global _installed
    hidden = {}
    if force:
        for name in [n for n in sys.modules if n == "grain" or n.startswith("grain.")]:
            hidden[name] = sys.modules.pop(name)
    sys.meta_path.insert(0, finder)
    _installed = _Installed(finder, hidden, os.environ.get(ENV_VAR))
    os.environ[ENV_VAR] = "force" if force else "1"


def uninstall_grain_alias() -> None:
    """Undoes :func:`install_grain_alias`: the finder, the alias modules, the variable.

    Real Grain modules hidden by ``force=True`` come back. Objects taken from the alias
    stay what they are (granary's). Idempotent.
    """
    global _installed, _permutation_before
    if _permutation_before is not _UNSET:
        from dataloader.samplers.index_sampler import PERMUTATION_ENV

        if _permutation_before is None:
            os.environ.pop(PERMUTATION_ENV, None)
        else:
            os.environ[PERMUTATION_ENV] = _permutation_before
        _permutation_before = _UNSET
    if _installed is None:
        return
    installed, _installed = _installed, None
    sys.meta_path[:] = [f for f in sys.meta_path if f is not installed.finder]
    for name in [n for n, m in sys.modules.items() if isinstance(m, GrainAliasModule)]:
        del sys.modules[name]
    sys.modules.update(installed.hidden)
    if installed.env is None:
        os.environ.pop(ENV_VAR, None)
    else:
        os.environ[ENV_VAR] = installed.env


def install_from_environment() -> None:
    """Installs the alias if ``GRANARY_GRAIN_ALIAS`` asks for it (``import dataloader``).

    ``1``: install, but only warn (``RuntimeWarning``) when a real Grain is installed,
    and import that one (checked when ``grain`` is first imported, see
    :class:`GrainAliasFinder`); ``force``: install over a real Grain; unset, empty or
    ``0``: nothing. The installed startup hook (``granary-grain-alias.pth``) calls this
    at interpreter start where the variable is set, through ``import dataloader``.

    Raises:
        ValueError: the variable holds another value.
    """
    value = os.environ.get(ENV_VAR, "")
    if value not in _ENV_VALUES:
        raise ValueError(
            f"{ENV_VAR}={value!r} is not a setting of the grain alias; expected 1 (install it), "
            f"force (install it over a real Grain) or 0; fix or unset the variable"
        )
    force = _ENV_VALUES[value]
    if force:
        install_grain_alias(force=True)
    elif force is not None and _installed is None:
        _install(GrainAliasFinder(check_real_first=True), force=False)
