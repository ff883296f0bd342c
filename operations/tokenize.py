"""``Tokenize``: text records to token arrays, with the tokenizer loaded once per process.

The operation travels to the worker processes as its settings alone (the tokenizer's
file or name, the options); the loaded tokenizer is never pickled. Each process loads
it on its first element and keeps it (:func:`~.tokenizer_backends.load`), so a pool of workers
reads the model file once per worker.

Input elements are text: ``bytes`` (UTF-8, e.g. an ArrayRecord record), ``str``, or a
dict whose ``feature`` holds bytes or str (a Parquet row, a parsed JSON record). The
output is a dict with the token ids under ``output_key`` as an ``int32`` array; a dict
input keeps its other keys (and its text too with ``keep_text=True``).

Example:
    >>> op = Tokenize("tokenizer.json", add_bos=True, add_eos=True)   # doctest: +SKIP
    >>> op.map(b"hello world")["tokens"]                              # doctest: +SKIP
    array([  1, 310, 297,   2], dtype=int32)
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .tokenizer_backends import KINDS, Backend, check_spec, infer_kind, load
from .transforms import MapTransform


def _text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview, np.bytes_)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{where} is not UTF-8 text ({error}); tokenize text records, or decode "
                f"them with a map before Tokenize"
            ) from None
    raise TypeError(
        f"{where} must be text (bytes or str), got {type(value).__name__}: {str(value)[:80]}"
    )


class Tokenize(MapTransform):
    """Turns text into an ``int32`` array of token ids (see the module docstring).

    Args:
        tokenizer: a SentencePiece ``.model`` file, a ``tokenizers`` JSON file (or a
            folder with ``tokenizer.json``), a tiktoken encoding name or ``.tiktoken`` file.
        kind: ``"sentencepiece"``, ``"huggingface"`` or ``"tiktoken"`` (MaxText's
            ``tokenizer_type``); by default told from ``tokenizer``'s form.
        feature: the key of the text when elements are dicts.
        output_key: the key of the token array in the output dict.
        add_bos: put the tokenizer's BOS id first.
        add_eos: put the tokenizer's EOS id last.
        bos_token: which special token (by text) is BOS, where the tokenizer's own is
            not wanted or not known (a tiktoken encoding has no BOS).
        eos_token: which special token (by text) is EOS, likewise.
        max_length: keep at most this many ids (BOS and EOS included), as MaxText's
            ``TokenizeAndTrim`` does; ``None`` keeps all (packing splits long sequences).
        keep_text: keep ``feature`` in the output dict.
        check: load the tokenizer now, in this process, so that a bad file or a missing
            BOS/EOS fails here rather than in a worker (the loaded tokenizer is not
            pickled with the operation).

    Raises:
        ValueError, TypeError, ImportError, FileNotFoundError: at construction, naming
            the argument, the value and what to do.
    """

    def __init__(
        self,
        tokenizer: str | os.PathLike,
        *,
        kind: str | None = None,
        feature: str | None = None,
        output_key: str = "tokens",
        add_bos: bool = False,
        add_eos: bool = False,
        bos_token: str | None = None,
        eos_token: str | None = None,
        max_length: int | None = None,
        keep_text: bool = False,
        check: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(tokenizer, (str, os.PathLike)) or not os.fspath(tokenizer):
            raise TypeError(f"tokenizer must be a file path or an encoding name, got {tokenizer!r}")
        self.spec = os.fspath(tokenizer)
        if kind is not None and kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)} (or None), got {kind!r}")
        self.kind = kind or infer_kind(self.spec)
        for name, value in (("feature", feature), ("bos_token", bos_token), ("eos_token", eos_token)):
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(f"{name} must be a non-empty str or None, got {value!r}")
        if not isinstance(output_key, str) or not output_key:
            raise TypeError(f"output_key must be a non-empty str, got {output_key!r}")
        for name, flag in (("add_bos", add_bos), ("add_eos", add_eos), ("keep_text", keep_text), ("check", check)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1):
            raise ValueError(f"max_length must be a positive integer or None, got {max_length!r}")
        self.feature, self.output_key = feature, output_key
        self.add_bos, self.add_eos = add_bos, add_eos
        self.bos_token, self.eos_token = bos_token, eos_token
        self.max_length, self.keep_text = max_length, keep_text
        self._backend: Backend | None = None
        check_spec(self.kind, self.spec)
        if add_bos and bos_token is None and self.kind == "tiktoken" and not self.spec.lower().endswith(".tiktoken"):
            # Known without loading (which may need the network): no tiktoken encoding has one.
            raise ValueError(
                f"add_bos=True but the tiktoken encoding {self.spec!r} has no BOS token; name "
                f"one with bos_token=... (a special token of the encoding) or set add_bos=False"
            )
        if check:
            self._check_specials(self.backend)

    # -- the loaded tokenizer ------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        """The tokenizer, loaded in this process on first use (shared by the process)."""
        if self._backend is None:
            self._backend = load(self.kind, self.spec, self.bos_token, self.eos_token)
            self._check_specials(self._backend)
        return self._backend

    def _check_specials(self, backend: Backend) -> None:
        for flag, value, what, arg in ((self.add_bos, backend.bos_id, "BOS", "bos_token"),
                                       (self.add_eos, backend.eos_id, "EOS", "eos_token")):
            if flag and value is None:
                raise ValueError(
                    f"add_{what.lower()}=True but the {self.kind} tokenizer {self.spec!r} has no "
                    f"{what} token; name one with {arg}=... or set add_{what.lower()}=False"
                )

    @property
    def bos_id(self) -> int | None:
        return self.backend.bos_id

    @property
    def eos_id(self) -> int | None:
        return self.backend.eos_id

    @property
    def pad_id(self) -> int | None:
        return self.backend.pad_id

    @property
    def vocab_size(self) -> int:
        return self.backend.vocab_size

    def encode(self, text: str | bytes) -> np.ndarray:
        """The ids of one text, with BOS/EOS and the length limit applied (``int32``)."""
        backend = self.backend
        ids = list(backend.encode(_text(text, "the text")))
        if self.add_bos and backend.bos_id is not None:  # checked when loaded
            ids.insert(0, backend.bos_id)
        if self.add_eos and backend.eos_id is not None:
            ids.append(backend.eos_id)
        if self.max_length is not None:
            ids = ids[: self.max_length]
        return np.asarray(ids, dtype=np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of ``ids`` (special tokens as the library writes them)."""
        return self.backend.decode([int(i) for i in np.asarray(ids).reshape(-1)])

    # -- the operation --------------------------------------------------------------------

    def map(self, element: Any) -> dict[str, Any]:
        if isinstance(element, Mapping):
            if self.feature is None:
                raise TypeError(
                    f"Tokenize got a dict (keys {sorted(element)}) but no feature; pass "
                    f"feature= the key of the text"
                )
            if self.feature not in element:
                raise KeyError(
                    f"Tokenize(feature={self.feature!r}): the element has no such key (it has "
                    f"{sorted(element)})"
                )
            out = dict(element)
            text = out[self.feature] if self.keep_text else out.pop(self.feature)
            out[self.output_key] = self.encode(_text(text, f"feature {self.feature!r}"))
            return out
        if self.feature is not None:
            raise TypeError(
                f"Tokenize(feature={self.feature!r}) expects dict elements, got "
                f"{type(element).__name__}; leave feature unset to tokenize bytes or str"
            )
        return {self.output_key: self.encode(_text(element, "the element"))}

    @property
    def name(self) -> str:
        return f"Tokenize({self.kind}:{os.path.basename(self.spec) or self.spec})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_backend"] = None  # loaded again, once, in the process that unpickles
        return state
