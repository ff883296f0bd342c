"""The configs shipped with granary (``dataloader.configs``), found through the package.

The YAML files of the repository's ``configs/`` folder are installed as package data of
``dataloader.configs``, so they are there wherever granary is installed, whatever the
working directory. :func:`shipped_config` gives one's path; :func:`config_file` is how
:func:`~dataloader.config.load_config`, ``dl.maxtext.load_maxtext_config`` and the
command line (``python -m dataloader run array_record_images``) read a name as that
path when no file of that name exists.

Example:
    >>> import os
    >>> os.path.basename(shipped_config("demo"))
    'demo.yaml'
"""

from __future__ import annotations

import os
from importlib import resources

from dataloader.errors import ConfigError

PACKAGE = "dataloader.configs"
SUFFIX = ".yaml"


def shipped_configs() -> list[str]:
    """The names of the shipped configs (without ``.yaml``), sorted."""
    files = resources.files(PACKAGE).iterdir()
    return sorted(f.name[: -len(SUFFIX)] for f in files if f.name.endswith(SUFFIX))


def shipped_config(name: str) -> str:
    """The path of the config ``name`` shipped with granary.

    Args:
        name: a shipped config's name, with or without ``.yaml``: ``"demo"``,
            ``"lm_demo"``, ``"array_record_images"``, ``"parquet"``, ``"maxtext"``.

    Returns:
        The path of its YAML file inside the installed package.

    Raises:
        ConfigError: no shipped config has that name; the message lists those there are.
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a shipped config's name must be a non-empty string, got {name!r}")
    stem = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name
    names = shipped_configs()
    if stem not in names:
        raise ConfigError(
            f"no config named {name!r} is shipped with granary; the shipped configs are "
            f"{', '.join(names)} (or give the path of a YAML file)"
        )
    return str(resources.files(PACKAGE) / f"{stem}{SUFFIX}")


def config_file(path: str | os.PathLike) -> str:
    """``path`` itself when it names a file (or a folder is in it), else the shipped
    config of that name when there is one, else ``path`` (whose reading then fails,
    naming it)."""
    path = os.fspath(path)
    if os.path.exists(path) or os.sep in path or (os.altsep and os.altsep in path):
        return path
    stem = path[: -len(SUFFIX)] if path.endswith(SUFFIX) else path
    return shipped_config(stem) if stem in shipped_configs() else path
