"""MkDocs hook: lays out the package as it is installed, for the reference pages.

The repository keeps ``samplers/``, ``sources/``, ``operations/`` and ``configs/`` at
its top level and installs them beneath the one import name ``dataloader``
(``setup.py``'s ``package_dir``). mkdocstrings reads the code without importing it
(griffe's static analysis), and finds a package by its folder, so it would find
``samplers`` but never ``dataloader.samplers``. Before the build this hook makes
``build/docs-api/dataloader/``: a link to each entry of ``dataloader/``, plus a link
named after each mapped folder, the tree ``pip install`` would make. The reference
pages then name everything by its installed path (``::: dataloader.samplers.IndexSampler``)
and nothing is imported, so building the site needs neither JAX nor Ray nor Beam.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from mkdocs.plugins import event_priority

# installed package -> folder in the repository (the mapping of setup.py)
MAPPED = {"samplers": "samplers", "sources": "sources", "operations": "operations", "configs": "configs"}
TREE = os.path.join("build", "docs-api")


def build_tree(root: str) -> str:
    """Makes ``root/build/docs-api/dataloader`` (links into ``root``); returns its parent."""
    tree = os.path.join(root, TREE)
    package = os.path.join(tree, "dataloader")
    shutil.rmtree(tree, ignore_errors=True)
    os.makedirs(package)
    source = os.path.join(root, "dataloader")
    for entry in os.listdir(source):
        if entry != "__pycache__":
            os.symlink(os.path.join(source, entry), os.path.join(package, entry))
    for name, folder in MAPPED.items():
        os.symlink(os.path.join(root, folder), os.path.join(package, name))
    return tree


# Before mkdocstrings' own on_config: it keeps only the search paths that exist when it
# reads them, so on a fresh clone (no build/ yet) it would miss the tree.
@event_priority(100)
def on_config(config: Any, **kwargs: Any) -> Any:
    build_tree(os.path.dirname(os.path.abspath(config.config_file_path)))
    return config
