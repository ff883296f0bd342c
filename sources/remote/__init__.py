"""Data in object stores: URLs for every file-backed source, read through fsspec.

:mod:`.urls` finds, lists and opens ``gs://``, ``s3://``, ``hf://``, ``az://`` and any
fsspec URL, with retries and clear errors; :mod:`.array_record` gives ArrayRecord
random access by ranged requests into a local sparse cache (:mod:`.cache`), from each
file's chunk index (:mod:`.chunk_index`), read once.
"""

from __future__ import annotations

from .array_record import RemoteOptions
from .urls import is_url, open_path, pyarrow_filesystem

__all__ = ["RemoteOptions", "is_url", "open_path", "pyarrow_filesystem"]
