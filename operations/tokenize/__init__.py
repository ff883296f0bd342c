"""Tokenization: SentencePiece, Hugging Face ``tokenizers`` or ``tiktoken``, loaded lazily
once per process (each library an optional extra, imported only when used)."""

from .backends import KINDS, Backend, infer_kind
from .transform import Tokenize

__all__ = ["KINDS", "Backend", "Tokenize", "infer_kind"]
