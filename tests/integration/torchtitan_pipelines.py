"""A text pipeline in the shape of torchtitan's Grain data loader, importable by workers.

torchtitan (``torchtitan/components/data/``) builds its loaders from Grain calls only:
a random-access source, ``filter`` and ``random_map`` (its sample processor: tokenize,
shift into inputs and labels), ``shuffle``, a contiguous slice per data-parallel rank,
``repeat``, then ``to_iter_dataset(read_options=...)``, a packer
(``FirstFitPackIterDataset`` or ``ConcatThenSplitIterDataset``) or a weighted
``MapDataset.mix``, ``batch(n, drop_remainder=..., batch_fn=collator)`` and a
``ThreadPrefetchIterDataset``. The code below is written for these tests (numpy only, so
a worker that imports it stays light); it makes those calls with torchtitan's arguments.
The torch collator lives in the test module: it runs in the training process only.
"""

from __future__ import annotations

import dataclasses
import os
from functools import partial
from typing import Any

import numpy as np

import dataloader as grain

IGNORE_INDEX = -100
BOS, EOS = 1, 2


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TextSequence:
    input_ids: np.ndarray
    labels: np.ndarray
    positions: np.ndarray | None = None


def rows(count: int, salt: int = 0) -> list[dict[str, Any]]:
    """Documents of 1 to 12 words, their lengths varying with the index."""
    words = ["granary", "feeds", "the", "trainer", "every", "step", "on", "time"]
    return [
        {"text": " ".join(words[(i * 7 + j + salt) % len(words)] for j in range(1 + (i * 5 + salt) % 12)), "id": i}
        for i in range(count)
    ]


class ByteTokenizerProcessor:
    """torchtitan's sample-processor shape: ``(sample, rng) -> TextSequence | None``.

    Tokens are bytes shifted past the special ids, with BOS and EOS; ``rng`` masks one
    label in eight (a stand-in for a random augmentation, so ``random_map``'s per-record
    generator is part of the output). Each call appends this process's pid to
    ``pid_file`` when one is given, so a test can see where samples were processed.
    """

    def __init__(self, pid_file: str | None = None) -> None:
        self.pid_file = pid_file

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator) -> TextSequence | None:
        if self.pid_file is not None:
            with open(self.pid_file, "a") as f:
                f.write(f"{os.getpid()}\n")
        tokens = np.array([BOS, *(b + 3 for b in sample["text"].encode()), EOS], dtype=np.int64)
        if len(tokens) < 2:
            return None
        labels = tokens[1:].copy()
        labels[rng.random(len(labels)) < 0.125] = IGNORE_INDEX
        return TextSequence(input_ids=tokens[:-1], labels=labels)


class ChatTemplateTokenizer:
    """torchtitan's tokenizer shape: it compiles its chat template with jinja2 when built
    (``BaseTokenizer.set_chat_template``: a sandboxed environment whose globals hold
    closures), so it holds a ``jinja2.Template``, which pickles but did not unpickle."""

    def __init__(self, chat_template: str) -> None:
        import jinja2.ext
        import jinja2.sandbox

        def raise_exception(msg: str) -> None:
            raise jinja2.exceptions.TemplateError(msg)

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.globals["raise_exception"] = raise_exception
        self._chat_template = env.from_string(chat_template)

    def apply_chat_template(self, messages: list[dict[str, str]]) -> str:
        return self._chat_template.render(messages=messages)

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        return [BOS] * add_bos + [b + 3 for b in text.encode()] + [EOS] * add_eos


CHAT_TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"


class ChatProcessor:
    """torchtitan's ``ChatProcessor`` shape: the row as a chat turn through the tokenizer's
    compiled template, then tokens shifted into inputs and labels."""

    def __init__(self, tokenizer: ChatTemplateTokenizer) -> None:
        self._tokenizer = tokenizer

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator) -> TextSequence | None:
        del rng
        text = self._tokenizer.apply_chat_template([{"role": "user", "content": sample["text"]}])
        tokens = np.asarray(self._tokenizer.encode(text), dtype=np.int64)
        return TextSequence(input_ids=tokens[:-1], labels=tokens[1:])


def shard_of(ds: grain.MapDataset, rank: int, world: int) -> grain.MapDataset:
    """torchtitan's contiguous per-rank slice (the first ``len % world`` ranks take one more)."""
    size, extra = divmod(len(ds), world)
    start = rank * size + min(rank, extra)
    return ds[start:start + size + (1 if rank < extra else 0)]


def single(source_rows: list[dict[str, Any]], *, seed: int, rank: int = 0, world: int = 1,
           pid_file: str | None = None, processor: Any = None) -> grain.MapDataset:
    """torchtitan's ``SingleDatasetConfig`` on a map-style source (its sample processor:
    ``processor``, by default :class:`ByteTokenizerProcessor`)."""
    ds = grain.MapDataset.source(source_rows)
    ds = ds.filter(lambda row: bool(row["text"]))
    ds = ds.random_map(processor or ByteTokenizerProcessor(pid_file), seed=seed)
    ds = ds.filter(lambda sample: len(sample.input_ids) > 3)
    ds = ds.shuffle(seed=seed)
    return shard_of(ds, rank, world).repeat()


def to_packing_input(sample: TextSequence, *, max_context_length: int) -> dict[str, np.ndarray]:
    positions = sample.positions
    if positions is None:
        positions = np.arange(len(sample.input_ids), dtype=np.int64) % max_context_length
    return {"input_ids": np.asarray(sample.input_ids), "labels": np.asarray(sample.labels),
            "positions": np.asarray(positions)}


def to_text_sequence(packed: dict[str, np.ndarray]) -> TextSequence:
    labels = np.asarray(packed["labels"]).copy()
    labels[np.asarray(packed["input_ids_segment_ids"]) == 0] = IGNORE_INDEX
    starts = np.asarray(packed["positions"]) == 0
    index = np.arange(len(starts), dtype=np.int64)
    return TextSequence(input_ids=np.asarray(packed["input_ids"]), labels=labels,
                        positions=index - np.maximum.accumulate(np.where(starts, index, 0)))


def first_fit_packed(ds: grain.MapDataset, *, seed: int, max_context_length: int, tokens_per_row: int,
                     read_options: grain.ReadOptions) -> grain.IterDataset:
    """torchtitan's ``FirstFitPackingConfig.build`` after its dataset."""
    ds = ds.filter(partial(_fits, max_context_length=max_context_length))
    ds = ds.map(partial(to_packing_input, max_context_length=max_context_length))
    it = ds.to_iter_dataset(read_options=read_options)
    it = grain.experimental.FirstFitPackIterDataset(
        it,
        length_struct={"input_ids": tokens_per_row, "labels": tokens_per_row, "positions": tokens_per_row},
        padding_struct={"input_ids": 0, "labels": IGNORE_INDEX, "positions": 0},
        num_packing_bins=4,
        meta_features=("labels", "positions"),
        seed=seed,
        shuffle_bins=True,
    )
    return it.map(to_text_sequence)


def _fits(sample: TextSequence, *, max_context_length: int) -> bool:
    return len(sample.input_ids) <= max_context_length


def mixed(parts: list[grain.MapDataset], weights: list[float]) -> grain.MapDataset:
    """torchtitan's ``DatasetMixConfig`` when every child is map-style."""
    return grain.MapDataset.mix(parts, weights=weights)


def loader_stream(ds: grain.MapDataset | grain.IterDataset, *, rows_per_batch: int, collator: Any,
                  read_options: grain.ReadOptions, num_prefetch_batches: int = 2) -> grain.IterDataset:
    """torchtitan's ``GrainDataLoader.__init__`` after building the dataset."""
    if isinstance(ds, grain.MapDataset):
        ds = ds.to_iter_dataset(read_options=read_options)
    ds = ds.batch(rows_per_batch, drop_remainder=True, batch_fn=collator)
    return grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=num_prefetch_batches)
