"""Build script: metadata lives in setup.cfg; this file says where the packages are.

The repository keeps ``samplers/``, ``sources/``, ``operations/`` and ``configs/`` at
its top level, but they are installed beneath the one import name ``dataloader``
(``dataloader.samplers``, ...), so a user's own ``operations.py`` or ``samplers/``
never shadows them. ``package_dir`` maps each installed package to its folder; this
works for ``pip install .`` and for ``pip install -e .`` (setuptools' editable finder
reads the same mapping).

Beside the packages, the install puts one startup hook in site-packages,
``granary-grain-alias.pth`` (:data:`ALIAS_HOOK`): Python runs its line at every start,
and it does nothing unless ``GRANARY_GRAIN_ALIAS`` is set; then it imports
``dataloader``, which installs the grain alias, so that ``GRANARY_GRAIN_ALIAS=1 python
train.py`` runs a ``train.py`` whose first line is ``import grain`` on granary.
"""

from __future__ import annotations

import os

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

# installed package -> folder in the repository
ROOTS = {
    "dataloader": "dataloader",
    "dataloader.samplers": "samplers",
    "dataloader.sources": "sources",
    "dataloader.operations": "operations",
    "dataloader.configs": "configs",
}

# The startup hook: its name sorts after setuptools' `__editable__.*.pth`, whose finder
# must be in place before an editable install can import dataloader. Unset, the line
# costs one lookup in os.environ (site has imported os already).
ALIAS_HOOK = "granary-grain-alias.pth"
ALIAS_HOOK_LINE = (
    "import os; os.environ.get('GRANARY_GRAIN_ALIAS', '0') not in ('', '0') "
    "and __import__('dataloader')\n"
)


def _packages() -> list[str]:
    found = []
    for name, folder in ROOTS.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(folder, exclude=["*.tests", "tests"])]
    return found


class BuildWithAliasHook(build_py):
    """``build_py`` that also writes :data:`ALIAS_HOOK` at the root of what is installed.

    A wheel (``pip install .``) takes it from the build folder. An editable wheel
    (``pip install -e .``) takes nothing from there, only what its install command
    writes: setuptools points that command's ``install_lib`` at the editable wheel's
    root, so the hook goes there.
    """

    def run(self) -> None:
        super().run()
        root = self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib
        os.makedirs(root, exist_ok=True)
        with open(os.path.join(root, ALIAS_HOOK), "w", encoding="utf-8") as f:
            f.write(ALIAS_HOOK_LINE)

    def get_outputs(self, *args, **kwargs) -> list[str]:
        hook = [] if self.editable_mode else [os.path.join(self.build_lib, ALIAS_HOOK)]
        return [*super().get_outputs(*args, **kwargs), *hook]


setup(
    packages=_packages(),
    package_dir=ROOTS,
    package_data={"dataloader.configs": ["*.yaml"]},
    cmdclass={"build_py": BuildWithAliasHook},
)
