"""MosaicML ``streaming``: ``StreamingDataset`` with ``StreamingDataLoader.state_dict()``
(its "Fast Resumption" page). It does not install beside this environment: every
release up to 0.13.0 (the newest) requires ``numpy<2.2.0`` and ``transformers<5``
(hence ``huggingface_hub<1.0``), where this environment has numpy 2.4 (JAX and the
project) and huggingface_hub 2.x. The column says so in every cell unless it is
installed, and then it runs."""

from __future__ import annotations

import importlib.metadata
from typing import Any

from resume.base import Column

WHY = (
    "mosaicml-streaming 0.13.0 (the newest release, as every release since 0.11) requires "
    "numpy<2.2.0 and transformers<5 (so huggingface_hub<1.0); this environment has "
    "numpy 2.4 (JAX 0.10 and granary) and huggingface_hub 2.x (tokenizers), so pip cannot "
    "install it here (ResolutionImpossible)"
)


class MosaicStreaming(Column):
    name = "mosaic-streaming"
    packages = ("mosaicml-streaming",)

    def missing(self) -> str | None:
        try:
            importlib.metadata.version("mosaicml-streaming")
        except importlib.metadata.PackageNotFoundError:
            return WHY
        return "installed, but this column has no runner: it could not be written without the package"

    def open(self, ctx: Any, state: Any) -> Any:
        raise NotImplementedError(WHY)
