"""Griffe extension: reads our docstrings' two Sphinx habits as mkdocstrings expects.

The code's docstrings are Google style, with two habits from Sphinx's napoleon that
griffe's Google parser reads differently:

* ``Example:`` as a section title. napoleon takes it as ``Examples:``; griffe takes it
  as an admonition and renders its ``>>>`` lines as Markdown (where ``[...][0, 1]``
  reads as a link). It is renamed ``Examples:`` so the lines render as code.
* Roles such as ``:class:`~samplers.sharding.NoSharding``` or ``:meth:`describe```.
  They become inline code showing the name as Sphinx would (the last part after ``~``).

The text of the docstrings in the code is not changed; only what the site renders.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.M)
_ROLE = re.compile(r":(?:class|meth|func|mod|attr|obj|exc|data|const|py:\w+):`(~?)([^`]+)`")


def _role(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    target = target.strip()
    if tilde:
        target = target.rsplit(".", 1)[-1]
    return f"`{target.lstrip('.')}`"


def rewrite(text: str) -> str:
    """The docstring as mkdocstrings should read it."""
    return _ROLE.sub(_role, _EXAMPLE.sub(r"\1Examples:", text))


class SphinxHabits(griffe.Extension):
    """Applies :func:`rewrite` to every docstring griffe loads."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
