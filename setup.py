"""Build script: metadata lives in setup.cfg; this file says where the packages are.

The repository keeps ``samplers/``, ``sources/``, ``operations/`` and ``configs/`` at
its top level, but they are installed beneath the one import name ``dataloader``
(``dataloader.samplers``, ...), so a user's own ``operations.py`` or ``samplers/``
never shadows them. ``package_dir`` maps each installed package to its folder; this
works for ``pip install .`` and for ``pip install -e .`` (setuptools' editable finder
reads the same mapping).
"""

from setuptools import find_packages, setup

# installed package -> folder in the repository
ROOTS = {
    "dataloader": "dataloader",
    "dataloader.samplers": "samplers",
    "dataloader.sources": "sources",
    "dataloader.operations": "operations",
    "dataloader.configs": "configs",
}


def _packages() -> list[str]:
    found = []
    for name, folder in ROOTS.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(folder, exclude=["*.tests", "tests"])]
    return found


setup(
    packages=_packages(),
    package_dir=ROOTS,
    package_data={"dataloader.configs": ["*.yaml"]},
)
