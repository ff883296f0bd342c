"""The language model's data: Python's own standard library, as text records, and a BPE
tokenizer trained on it at first run.

Every machine that runs Python has the standard library's sources, so nothing is
downloaded. The modules beside ``os.py`` (sorted by name, up to ``max_bytes``) are cut
at blank lines into pieces (a function, a class, a docstring: ``min_chars`` to
``max_chars`` characters): records of varied lengths, as documents are, which is what
packing is for. Every
``eval_every``-th piece is held out for the eval pass.

The tokenizer is a byte-level BPE of Hugging Face ``tokenizers`` (the ``demo`` extra),
trained on the training pieces in a second or two and saved as ``tokenizer.json``.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from typing import Any

from dataloader.sources import write_array_record

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>"]  # ids 0, 1, 2


def stdlib_files(max_bytes: int) -> list[str]:
    """The standard library's top-level modules, sorted, up to ``max_bytes`` in all."""
    folder = os.path.dirname(os.__file__)
    chosen, total = [], 0
    for path in sorted(glob.glob(os.path.join(folder, "*.py"))):
        size = os.path.getsize(path)
        if total + size > max_bytes:
            continue
        chosen.append(path)
        total += size
    if not chosen:
        raise FileNotFoundError(f"no Python sources found beside os.py in {folder}")
    return chosen


def pieces(text: str, min_chars: int, max_chars: int) -> Iterator[str]:
    """``text`` cut at blank lines: blocks shorter than ``min_chars`` join the next one,
    blocks longer than ``max_chars`` are cut."""
    current = ""
    for block in text.split("\n\n"):
        block = block.strip("\n")
        if not block.strip():
            continue
        current = f"{current}\n\n{block}" if current else block
        while len(current) > max_chars:
            yield current[:max_chars]
            current = current[max_chars:]
        if len(current) >= min_chars:
            yield current
            current = ""
    if current:
        yield current


def write_text_shards(directory: str, *, max_bytes: int, min_chars: int, max_chars: int,
                      num_shards: int, eval_every: int) -> dict[str, Any]:
    """Writes ``train-*.array_record`` (``num_shards``) and ``eval-00000-of-00001.array_record``.

    Returns:
        ``{"train": [paths], "eval": path, "train_texts": [str], "files": int, "bytes": int}``.
    """
    os.makedirs(directory, exist_ok=True)
    train: list[str] = []
    held_out: list[str] = []
    size = 0
    files = stdlib_files(max_bytes)
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        size += len(text)
        for piece in pieces(text, min_chars, max_chars):
            (held_out if (len(train) + len(held_out)) % eval_every == eval_every - 1 else train).append(piece)
    shard_paths = []
    for shard in range(num_shards):
        path = os.path.join(directory, f"train-{shard:05d}-of-{num_shards:05d}.array_record")
        write_array_record(path, [t.encode() for t in train[shard::num_shards]])
        shard_paths.append(path)
    eval_path = os.path.join(directory, "eval-00000-of-00001.array_record")
    write_array_record(eval_path, [t.encode() for t in held_out])
    return {"train": shard_paths, "eval": eval_path, "train_texts": train, "eval_count": len(held_out),
            "files": len(files), "bytes": size}


def train_tokenizer(texts: list[str], path: str, vocab_size: int) -> str:
    """Trains a byte-level BPE on ``texts`` and saves it to ``path`` (``tokenizers`` JSON)."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise ImportError(
            "the language-model demo trains a Hugging Face tokenizers BPE; install it with "
            "pip install -e '.[demo]' (make demo does so)"
        ) from None
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.save(path)
    return path
