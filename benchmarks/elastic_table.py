"""Records lost and repeated across a change of host count, for every kind of pipeline.

For each pipeline (plain batch, filter, flat map, mixture, Parquet stream, first-fit,
best-fit and concat-then-split packing, window shuffle) and each change of host count
(1->2, 2->3, 3->1), hosts are simulated in one process (a loader per
``ShardOptions(h, H)``): every host takes some steps, every state is saved, the new
hosts restore with ``dl.elastic_iterator(loader, states)`` and run to the end of the
one-epoch stream. The record ids used over the whole run are compared with one
uninterrupted run: the table prints how many were lost and how many repeated (both
must be 0), over several save steps (the sums over all of them).

The rows "first-fit, cut" and "best-fit, cut" pack sequences of up to 30 tokens into rows
of 12 (best-fit with shuffled rows), so elements are cut into pieces across rows and
rounds; their ids are counted per token. A save where a middle piece of an element came
out before both its neighbours is refused (StateMismatchError, nothing lost or
repeated); a cell counts such saves, if any.
"window shuffle" is the map window shuffle on the engine; "stream window shuffle" is
WindowShuffleIterDataset's stage (one window in memory) over the engine's stream, alone
and under a first-fit packer.
The map or filter after a packer or a window shuffle runs on the pooled stage (worker
processes with ``--workers 2``, in this process with 0): "first-fit, map, filter" is a
loader's; the rows "pooled ... over first-fit" and "first-fit over pooled ..." are
datasets under ``mp_prefetch``, restored with ``iterator.set_state(every old state)``
(their row filter keeps every row: which records a row filter drops depends on how they
were packed, and the new hosts pack the open bins' records into other rows).
"first-fit, first-fit" (a loader's) and "first-fit over first-fit" pack rows of 12 into
rows of 24, each inner row whole in an outer one; their ids are counted per token.

    python benchmarks/elastic_table.py [--steps 1,2,3,5] [--workers 0] [--rows "name|name"]
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = ["plain", "filter", "flat map", "mixture", "Parquet stream", "first-fit", "best-fit",
        "first-fit, cut", "best-fit, cut", "concat-then-split", "window shuffle",
        "stream window shuffle", "stream window shuffle, first-fit", "stream window shuffle, map, first-fit",
        "first-fit, map, filter", "pooled map over first-fit", "pooled filter over first-fit",
        "first-fit over pooled map", "first-fit over pooled filter", "first-fit, first-fit",
        "first-fit over first-fit", "first-fit over pooled map over first-fit"]
CHANGES = {"1->2": (1, 2), "2->3": (2, 3), "3->1": (3, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="1,2,3,5", help="save steps to try, comma-separated")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--rows", default="|".join(ROWS), help="rows to run, separated by |")
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    from dataloader.errors import StateMismatchError
    from tests.dataloader.engine.elastic_cases import lost_and_repeated

    steps = [int(s) for s in args.steps.split(",")]
    print(f"| pipeline | {' | '.join(CHANGES)} |")
    print(f"|---|{'---|' * len(CHANGES)}")
    for name in args.rows.split("|"):
        cells = []
        for old, new in CHANGES.values():
            lost = repeated = refused = 0
            for k in steps:
                try:
                    got = lost_and_repeated(name, [(old, k), (new, None)], args.workers)
                except StateMismatchError:
                    refused += 1
                    continue
                lost, repeated = lost + got[0], repeated + got[1]
            note = f" ({refused} of {len(steps)} saves refused)" if refused else ""
            cells.append(f"{lost} lost / {repeated} repeated{note}")
        print(f"| {name} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
