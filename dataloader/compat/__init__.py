"""Unchanged Grain code on granary: ``import grain`` resolves to granary's objects.

Where you can edit the code, ``import dataloader as grain`` is enough. Where you cannot
(MaxText, torchtitan, a library that says ``import grain.python as grain`` or
``from grain._src.python.dataset.sources.tfrecord_dataset import _TFRecordReader``),
install the alias, one of three ways:

* ``dataloader.compat.install_grain_alias()`` in the program, before it imports Grain;
* ``GRANARY_GRAIN_ALIAS=1`` in the environment: ``GRANARY_GRAIN_ALIAS=1 python train.py``
  (the installed startup hook, ``granary-grain-alias.pth``, imports ``dataloader`` as
  Python starts, which installs it; so does any ``import dataloader``);
* ``python -m dataloader.compat script.py [args]`` (also ``-m module`` and ``-c code``).

The alias holds in the loader's worker processes and fork server too (they inherit
the environment variable). Which Grain module gives which granary name is the table of
:mod:`dataloader.compat.modules`; a real installed Grain is never shadowed unless
``force=True`` (``GRANARY_GRAIN_ALIAS=force``).

This room holds the alias only: the finder (:mod:`.alias`), its table (:mod:`.modules`),
stand-ins for Grain's private classes that real code imports (:mod:`.tfrecord`) and the
runner (:mod:`.__main__`). Grain's names themselves live in granary's own rooms.
"""

from __future__ import annotations

from dataloader.compat.alias import (
    ENV_VAR,
    GrainAliasFinder,
    GrainAliasModule,
    RealGrainError,
    install_from_environment,
    install_grain_alias,
    is_installed,
    uninstall_grain_alias,
)

__all__ = [
    "ENV_VAR",
    "GrainAliasFinder",
    "GrainAliasModule",
    "RealGrainError",
    "install_from_environment",
    "install_grain_alias",
    "is_installed",
    "uninstall_grain_alias",
]
