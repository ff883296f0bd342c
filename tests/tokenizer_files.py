"""Small real tokenizers of each library, trained here from text the tests write.

SentencePiece and Hugging Face ``tokenizers`` train a model of a few hundred pieces in
well under a second; a ``*.tiktoken`` file is written by hand (the 256 bytes plus a few
merges), since tiktoken cannot train. Nothing is downloaded.
"""

from __future__ import annotations

import base64
import os

WORDS = ["the", "loader", "reads", "records", "by", "index", "and", "packs", "tokens", "into", "rows", "of", "fixed", "length", "so", "that", "the", "accelerator", "never", "waits", "for", "data", "while", "the", "model", "trains"]


def corpus(lines: int = 400) -> list[str]:
    """Deterministic English-like lines (a few KB) to train on and to tokenize."""
    out = []
    for i in range(lines):
        n = 4 + (i * 7) % 9
        out.append(" ".join(WORDS[(i * 3 + j * 5) % len(WORDS)] for j in range(n)) + ".")
    return out


def write_corpus(folder: str) -> str:
    path = os.path.join(folder, "corpus.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(corpus()) + "\n")
    return path


def sentencepiece_model(folder: str, *, with_bos: bool = True) -> str:
    """A SentencePiece BPE model (unk 0, bos 1, eos 2 unless ``with_bos=False``: no BOS)."""
    import sentencepiece as spm

    prefix = os.path.join(folder, "sp" if with_bos else "sp_nobos")
    spm.SentencePieceTrainer.train(
        input=write_corpus(folder), model_prefix=prefix, vocab_size=120, model_type="bpe",
        character_coverage=1.0, unk_id=0, bos_id=1 if with_bos else -1, eos_id=2, pad_id=-1,
        minloglevel=2, num_threads=1,
    )
    return prefix + ".model"


def huggingface_json(folder: str) -> str:
    """A byte-level BPE ``tokenizers`` JSON with ``<pad>`` 0, ``<s>`` 1 and ``</s>`` 2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    path = os.path.join(folder, "tokenizer.json")
    tok.save(path)
    return path


# The merges of the hand-written tiktoken file, in rank order after the 256 bytes.
TIKTOKEN_MERGES = [b"th", b"the", b" t", b" the", b"ro", b"row", b"ws"]


def tiktoken_file(folder: str) -> str:
    """A ``*.tiktoken`` file of ranks: byte ``b`` has rank ``b``, then :data:`TIKTOKEN_MERGES`."""
    ranks = {bytes([b]): b for b in range(256)}
    for i, merged in enumerate(TIKTOKEN_MERGES):
        ranks[merged] = 256 + i
    path = os.path.join(folder, "small.tiktoken")
    with open(path, "w") as f:
        for token, rank in ranks.items():
            f.write(f"{base64.b64encode(token).decode()} {rank}\n")
    return path
