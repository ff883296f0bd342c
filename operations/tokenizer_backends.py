"""The three tokenizer libraries behind one small interface, each imported only when used.

A tokenizer is named by a *spec* and a *kind* (MaxText's ``tokenizer_type`` names):

=================  ==========================================================================
kind               spec
=================  ==========================================================================
``sentencepiece``  a SentencePiece model file (``*.model``)
``huggingface``    a Hugging Face ``tokenizers`` JSON file (``tokenizer.json``), or a folder
                   holding one (its ``tokenizer_config.json``, if any, names BOS and EOS)
``tiktoken``       a ``tiktoken`` encoding name (``cl100k_base``, ``o200k_base``, ...), or a
                   ``*.tiktoken`` file of byte-pair ranks (with Llama 3's pattern and special
                   tokens, as MaxText's ``TikTokenTokenizer`` reads it)
=================  ==========================================================================

:func:`load` returns a :class:`Backend` and keeps it for the life of the process, so a
tokenizer is read once per process however many operations or unpickled copies use it.
Each library is imported by its loader, never at module import: a pipeline that does not
tokenize, and a worker whose pipeline does not, never pays for it.

A tiktoken encoding *name* needs the encoding's file: tiktoken downloads it on first use
and caches it (``TIKTOKEN_CACHE_DIR``). Offline, copy that cache or use a local
``*.tiktoken`` file; the error says so.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

KINDS = ("sentencepiece", "huggingface", "tiktoken")
# pip extra -> the module each kind needs
_MODULES = {"sentencepiece": "sentencepiece", "huggingface": "tokenizers", "tiktoken": "tiktoken"}

# Llama 3's pre-tokenization pattern and its special tokens, which is how MaxText reads a
# ``*.tiktoken`` file (MaxText's tokenizer.py): a file of ranks does not carry them.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_NAMED = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                 "<|reserved_special_token_1|>", "<|reserved_special_token_2|>",
                 "<|reserved_special_token_3|>", "<|start_header_id|>", "<|end_header_id|>",
                 "<|reserved_special_token_4|>", "<|eot_id|>"]
_LLAMA3_SPECIALS = _LLAMA3_NAMED + [f"<|reserved_special_token_{i}|>" for i in range(5, 251)]

# Names tried, in order, for BOS and EOS in a tokenizers JSON file that has no config.
_BOS_NAMES = ("<s>", "<bos>", "<|begin_of_text|>", "<|startoftext|>", "[CLS]")
_EOS_NAMES = ("</s>", "<eos>", "<|end_of_text|>", "<|endoftext|>", "[SEP]")


@dataclasses.dataclass(frozen=True)
class Backend:
    """A loaded tokenizer: ``encode(text) -> list of ids`` and its special ids (``None``
    where it has none)."""

    kind: str
    spec: str
    encode: Callable[[str], Sequence[int]]
    decode: Callable[[Sequence[int]], str]
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None


def infer_kind(spec: str) -> str:
    """The kind a spec names by its form (see the module docstring).

    Raises:
        ValueError: the form says nothing (pass ``kind=`` explicitly).
    """
    lower = spec.lower()
    if lower.endswith(".model"):
        return "sentencepiece"
    if lower.endswith(".json") or os.path.isdir(spec):
        return "huggingface"
    if lower.endswith(".tiktoken") or (os.sep not in spec and "." not in spec and not os.path.exists(spec)):
        return "tiktoken"
    raise ValueError(
        f"cannot tell which tokenizer {spec!r} is from its name; pass kind= one of "
        f"{', '.join(KINDS)} (a SentencePiece .model file, a tokenizers .json file, or a "
        f"tiktoken encoding name or .tiktoken file)"
    )


def check_spec(kind: str, spec: str) -> None:
    """Checks, without loading anything, that the library is installed and the file exists.

    Raises:
        ValueError: an unknown kind.
        ImportError: the kind's library is not installed (names the pip extra).
        FileNotFoundError: the file the spec names does not exist.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown tokenizer kind {kind!r}; expected one of {', '.join(KINDS)}")
    module = _MODULES[kind]
    if importlib.util.find_spec(module) is None:
        raise ImportError(
            f"a {kind} tokenizer needs the {module!r} package, which is not installed; "
            f"pip install 'granary[tokenizers]' (or pip install {module})"
        )
    is_name = kind == "tiktoken" and not spec.lower().endswith(".tiktoken")
    if not is_name and not os.path.exists(spec):
        raise FileNotFoundError(
            f"{kind} tokenizer file {spec!r} does not exist (relative paths are read from "
            f"{os.getcwd()})"
        )


_CACHE: dict[tuple[Any, ...], Backend] = {}
_CACHE_LOCK = threading.Lock()
_CACHE_PID = os.getpid()


def load(kind: str, spec: str, bos_token: str | None = None, eos_token: str | None = None) -> Backend:
    """The tokenizer, loaded once per process (thread-safe).

    Args:
        kind: one of :data:`KINDS`.
        spec: the file or encoding name.
        bos_token, eos_token: the special tokens to use as BOS and EOS (by their text),
            where the tokenizer's own are not wanted or not known.
    """
    global _CACHE_PID
    key = (kind, os.path.abspath(spec) if os.path.exists(spec) else spec, bos_token, eos_token)
    with _CACHE_LOCK:
        if os.getpid() != _CACHE_PID:  # a forked child: never share the parent's objects
            _CACHE.clear()
            _CACHE_PID = os.getpid()
        backend = _CACHE.get(key)
        if backend is None:
            check_spec(kind, spec)
            backend = _LOADERS[kind](spec, bos_token, eos_token)
            _CACHE[key] = backend
        return backend


def _special_id(kind: str, spec: str, token: str | None, lookup: Callable[[str], int | None]) -> int | None:
    if token is None:
        return None
    found = lookup(token)
    if found is None:
        raise ValueError(f"the {kind} tokenizer {spec!r} has no token {token!r}")
    return int(found)


def _sentencepiece(spec: str, bos_token: str | None, eos_token: str | None) -> Backend:
    spm = importlib.import_module("sentencepiece")
    try:
        sp = spm.SentencePieceProcessor(model_file=spec)
    except (OSError, RuntimeError) as error:
        raise ValueError(f"{spec!r} is not a SentencePiece model: {error}") from None

    def piece(token: str) -> int | None:
        i = sp.piece_to_id(token)
        return None if i == sp.unk_id() and token != sp.id_to_piece(sp.unk_id()) else i

    def own(i: int) -> int | None:
        return None if i < 0 else i

    bos = _special_id("sentencepiece", spec, bos_token, piece)
    eos = _special_id("sentencepiece", spec, eos_token, piece)
    return Backend("sentencepiece", spec, sp.encode, sp.decode, sp.vocab_size(),
                   own(sp.bos_id()) if bos is None else bos, own(sp.eos_id()) if eos is None else eos,
                   own(sp.pad_id()))


def _config_tokens(folder: str) -> dict[str, str]:
    """BOS/EOS/PAD token texts from a tokenizer_config.json beside the tokenizer, if any."""
    path = os.path.join(folder, "tokenizer_config.json")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    out = {}
    for name in ("bos_token", "eos_token", "pad_token"):
        value = config.get(name)
        if isinstance(value, dict):  # {"content": "<s>", ...} in newer files
            value = value.get("content")
        if isinstance(value, str):
            out[name] = value
    return out


def _huggingface(spec: str, bos_token: str | None, eos_token: str | None) -> Backend:
    tokenizers = importlib.import_module("tokenizers")
    path = os.path.join(spec, "tokenizer.json") if os.path.isdir(spec) else spec
    try:
        tok = tokenizers.Tokenizer.from_file(path)
    except Exception as error:  # the library raises a bare Exception for bad files
        raise ValueError(f"{path!r} is not a tokenizers JSON file: {error}") from None
    named = _config_tokens(os.path.dirname(os.path.abspath(path)))

    def first(explicit: str | None, configured: str | None, names: Sequence[str]) -> int | None:
        if explicit is not None:
            return _special_id("huggingface", spec, explicit, tok.token_to_id)
        for name in ([configured] if configured else []) + list(names):
            i = tok.token_to_id(name)
            if i is not None:
                return int(i)
        return None

    def encode(text: str) -> list[int]:
        # Special tokens are ours to add (add_bos/add_eos), never the post-processor's.
        return tok.encode(text, add_special_tokens=False).ids

    return Backend("huggingface", spec, encode, tok.decode, tok.get_vocab_size(),
                   first(bos_token, named.get("bos_token"), _BOS_NAMES),
                   first(eos_token, named.get("eos_token"), _EOS_NAMES),
                   first(None, named.get("pad_token"), ("<pad>", "[PAD]")))


def _tiktoken(spec: str, bos_token: str | None, eos_token: str | None) -> Backend:
    tiktoken = importlib.import_module("tiktoken")
    if spec.lower().endswith(".tiktoken"):
        from tiktoken.load import load_tiktoken_bpe

        ranks = load_tiktoken_bpe(spec)
        specials = {token: len(ranks) + i for i, token in enumerate(_LLAMA3_SPECIALS)}
        enc = tiktoken.Encoding(name=os.path.basename(spec), pat_str=LLAMA3_PATTERN,
                                mergeable_ranks=ranks, special_tokens=specials)
        default_bos, default_eos = specials["<|begin_of_text|>"], specials["<|end_of_text|>"]
    else:
        if spec not in tiktoken.list_encoding_names():
            raise ValueError(
                f"{spec!r} is not a tiktoken encoding; known names: "
                f"{', '.join(tiktoken.list_encoding_names())} (or pass a .tiktoken file)"
            )
        try:
            enc = tiktoken.get_encoding(spec)
        except Exception as error:  # network errors of several kinds
            raise ValueError(
                f"tiktoken could not load the encoding {spec!r} ({type(error).__name__}: "
                f"{str(error)[:200]}); tiktoken downloads an encoding's file on first use and "
                f"caches it in TIKTOKEN_CACHE_DIR: without network, copy that cache here or "
                f"pass a local .tiktoken file"
            ) from None
        default_bos, default_eos = None, enc.eot_token

    def special(token: str) -> int | None:
        return enc.encode_single_token(token) if token in enc.special_tokens_set else None

    bos = _special_id("tiktoken", spec, bos_token, special)
    eos = _special_id("tiktoken", spec, eos_token, special)

    def encode(text: str) -> list[int]:
        # Text that spells a special token is data, encoded as ordinary text.
        return enc.encode(text, disallowed_special=())

    return Backend("tiktoken", spec, encode, enc.decode, enc.n_vocab,
                   default_bos if bos is None else bos, default_eos if eos is None else eos, None)


_LOADERS: dict[str, Callable[[str, str | None, str | None], Backend]] = {
    "sentencepiece": _sentencepiece,
    "huggingface": _huggingface,
    "tiktoken": _tiktoken,
}
