"""What every column shares: the scenarios, the data, the per-record functions, the sizes.

The data is the same for every loader: record ``i`` is the int32 array
``full(1 + (7 * i) % 13, i + 1)`` (a "document" of 1 to 13 tokens, each token naming its
record; 0 is never a token, so padding never counts). Each loader reads it from its own
format, written from these arrays by :mod:`.data`. The pipeline is the same as far as
each loader allows: a global shuffle (seed 0), the scenario's operation, a batch.

Ids seen: a step (one batch) yields a list of ints, the ids of its elements: the record
id, or for the flat map ``10 * id + k`` (record ``id`` makes ``1 + id % 3`` elements),
or for packing one id per token (a packer moves tokens, so tokens are what is counted),
or for the mixture ``id`` for source A and ``100_000 + id`` for source B.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Sequence

import numpy as np

SCENARIOS = [
    "mid_epoch", "sigkill", "worker_count", "filter", "flat_map", "packing", "mixture",
    "epoch_boundary", "elastic", "worker_replaced", "source_changed",
]

DESCRIPTIONS = {
    "mid_epoch": "save mid-epoch, resume in a new process",
    "sigkill": "SIGKILL of the whole process group between saves, resume from the last save",
    "worker_count": "save with 2 workers, resume with 1",
    "filter": "a filter (drops id % 3 == 0) before the batch",
    "flat_map": "a flat map (record i makes 1 + i % 3 elements) before the batch",
    "packing": "sequence packing (documents of 1-13 tokens into rows of 32); tokens counted",
    "mixture": "a weighted mixture of two sources (0.3 / 0.7)",
    "epoch_boundary": "2 shuffled epochs, saved one batch before the end of the first, resumed across the boundary",
    "elastic": "2 hosts saved, resumed on 3 hosts",
    "worker_replaced": "a worker SIGKILLed just before the save; the run goes on, then resumes from that save",
    "source_changed": "the source files regenerated (same names, same ids, another order) before the resume: is it noticed?",
}

B_OFFSET = 100_000  # ids of the mixture's second source
SEED = 0
ROW = 32  # packed row length
WORKERS = 2


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How big a run is: ``records`` per source, ``batch`` elements a step."""

    records: int
    batch: int
    save_step: int  # steps before the save (mid-epoch scenarios, per host for elastic)
    save_every: int  # the SIGKILL scenario saves every this many steps ...
    kill_step: int  # ... and is killed after this step (past the last save)
    packed_batch: int  # rows per step when packing

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.records // self.batch)


FULL = Sizes(records=1000, batch=10, save_step=37, save_every=10, kill_step=44, packed_batch=4)
QUICK = Sizes(records=200, batch=8, save_step=9, save_every=4, kill_step=10, packed_batch=4)


def elastic_batch(sizes: Sizes, hosts: int) -> int:
    """Per-host batch of the elastic scenario: the global batch ``6 * (batch // 2)``
    stays the same on 2 and on 3 hosts (it divides by both), as a training job keeps it."""
    return 6 * (sizes.batch // 2) // hosts


def length(i: int) -> int:
    return 1 + (7 * i) % 13


def record(i: int) -> np.ndarray:
    """Record ``i``: its tokens, each ``i + 1``."""
    return np.full(length(i), i + 1, np.int32)


def order_for_change(n: int) -> list[int]:
    """The record ids in the order the regenerated files hold them (source_changed)."""
    return [int(x) for x in np.random.default_rng(12345).permutation(n)]


# ------------------------------------------------------------ per-record functions
# Module-level, so worker processes import them by name (PYTHONPATH holds benchmarks/).

_PID_DIR = os.environ.get("RESUME_MATRIX_PIDS")
_noted = False


def note_worker() -> None:
    """Leaves this process's pid in $RESUME_MATRIX_PIDS (once): how the worker_replaced
    scenario finds a process that runs the pipeline, whatever the loader."""
    global _noted
    if _PID_DIR and not _noted:
        _noted = True
        open(os.path.join(_PID_DIR, str(os.getpid())), "w").close()


def to_example(tokens: np.ndarray) -> dict:
    note_worker()
    tokens = np.asarray(tokens, np.int32)
    return {"id": int(tokens[0]) - 1, "tokens": tokens}


def decode(raw: bytes) -> dict:
    return to_example(np.frombuffer(raw, np.int32))


def keep(example: dict) -> bool:
    return example["id"] % 3 != 0


def fan_out(example: dict) -> list[dict]:
    i = example["id"]
    return [{"id": 10 * i + k, "tokens": example["tokens"]} for k in range(1 + i % 3)]


def id_only(example: dict) -> dict:
    return {"id": np.int64(example["id"])}


def tokens_only(example: dict) -> dict:
    return {"tokens": example["tokens"]}


def shift_b(example: dict) -> dict:
    return {"id": example["id"] + B_OFFSET, "tokens": example["tokens"]}


# ------------------------------------------------------------ comparing runs


def token_ids(tokens: np.ndarray) -> list[int]:
    """The record ids of a packed batch's tokens (padding is 0 and is left out)."""
    flat = np.asarray(tokens).reshape(-1)
    return [int(t) - 1 for t in flat[flat > 0]]


def compare(reference: Sequence[int], got: Sequence[int]) -> dict:
    """Records lost (fewer times in ``got`` than in the reference) and repeated (more
    times), and whether ``got`` is the reference in the same order."""
    want, have = collections.Counter(reference), collections.Counter(got)
    lost = sum((want - have).values())
    repeated = sum((have - want).values())
    return {"lost": lost, "repeated": repeated, "same_order": list(reference) == list(got)}
