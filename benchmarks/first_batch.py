"""First-batch latency of a first and a second loader in one training process.

A training script builds its train loader, iterates it, builds an eval loader, iterates
that, then goes back to training. This times ``iter(loader); next(it)`` for each of the
three, and counts the records of the first second after each first batch, to show what
the process's fork server buys: only the first loader waits for its start (and not even
that one when the script does something else between building it and ``iter()``,
``--setup``). Records are 1 KiB, decoded by a cheap map, in batches of 128.

    python benchmarks/first_batch.py --workers 2 [--setup 1.0] [--warm-start true|false]

Prints one JSON line (milliseconds and records).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np


def decode(x: int) -> np.ndarray:
    return np.frombuffer(np.full(1024, x % 251, np.uint8).tobytes(), np.uint8).astype(np.float32)


def make(n: int, seed: int, workers: int, kwargs: dict[str, Any]) -> Any:
    import dataloader as dl

    return dl.DataLoader(
        dl.RangeDataSource(n), dl.IndexSampler(n, shuffle=True, seed=seed, num_epochs=1),
        [dl.MapTransform(decode), dl.Batch(128)], worker_count=workers, **kwargs,
    )


def first_batch_and_first_second(loader: Any) -> tuple[float, int]:
    """Milliseconds from ``iter()`` to the first batch, and records in the next second."""
    started = time.perf_counter()
    it = iter(loader)
    next(it)
    first_ms = (time.perf_counter() - started) * 1e3
    clock, batches = time.perf_counter(), 1
    while time.perf_counter() - clock < 1.0:
        try:
            next(it)
        except StopIteration:
            break
        batches += 1
    it.close()
    return round(first_ms, 1), batches * 128


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--setup", type=float, default=0.0,
                        help="seconds between building the first loader and iter() (a model's set-up)")
    parser.add_argument("--warm-start", choices=["default", "true", "false"], default="default")
    args = parser.parse_args()
    kwargs = {} if args.warm_start == "default" else {"warm_start": args.warm_start == "true"}
    import dataloader  # noqa: F401  (imports are not timed)

    started = time.perf_counter()
    train = make(200_000, 0, args.workers, kwargs)
    build_ms = (time.perf_counter() - started) * 1e3
    time.sleep(args.setup)
    first = first_batch_and_first_second(train)
    evaluation = make(50_000, 1, args.workers, kwargs)
    second = first_batch_and_first_second(evaluation)
    again = first_batch_and_first_second(train)
    print(json.dumps({
        "workers": args.workers, "setup_s": args.setup, "warm_start": args.warm_start,
        "build_train_ms": round(build_ms, 1),
        "first_train_ms": first[0], "records_1s_train": first[1],
        "first_eval_ms": second[0], "records_1s_eval": second[1],
        "first_train_again_ms": again[0], "records_1s_train_again": again[1],
    }))


if __name__ == "__main__":
    main()
