"""How long a training step waits for data, fed with and without the device queue.

A jitted step of fixed cost consumes batches from a DataLoader (``--workers``
processes, a map doing ``--map-us`` of numpy work per record, ``Batch``). The loop
blocks on each step's result, as a loop that logs its loss does, and times every
``next()``: the share of wall time spent there is the time the step waited for data.

Steps (``--steps-kind``):

* ``matmul``: two matmuls sized to take ``--step-ms`` on this CPU. XLA then shares the
  host's cores with the loader's workers, as it would not on an accelerator.
* ``host-free``: a tiny jitted read of the batch, then the host idles for as long as
  the matmul step takes: what a host sees while an accelerator computes.

Feeds:

* ``loader + device_put``: ``next(loader_iterator)`` then ``jax.device_put`` in the
  loop (the worker pool still computes units ahead, but nothing is on the device early);
* ``device_prefetch``: ``dl.device_prefetch(loader, device)``.

It also reports the loader's throughput alone against the step's demand (batch size
over step time): the target is under 1% waiting whenever throughput exceeds demand;
the time from building the loader to its first batch on the device, with and without
the queue; and the bytes/s of ``device_prefetch`` against a bare ``jax.device_put``
loop over the same host batches (``--transfer-mb`` each).

    python benchmarks/device_step.py                      # defaults below
    python benchmarks/device_step.py --map-us 150         # a loader slower than the step
"""

from __future__ import annotations

import argparse
import itertools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import dataloader as dl


def make_map(dim: int, rounds: int):
    """A per-record map of ``rounds`` passes of numpy work over ``dim`` floats."""

    def decode(index: int) -> dict:
        x = np.random.default_rng(index).standard_normal(dim, dtype=np.float32)
        for _ in range(rounds):
            x = np.tanh(x * 1.0001)
        return {"x": x, "label": np.int32(index % 10)}

    return decode


def map_cost_us(dim: int, rounds: int) -> float:
    decode = make_map(dim, rounds)
    decode(0)
    start = time.perf_counter()
    for i in range(300):
        decode(i)
    return (time.perf_counter() - start) / 300 * 1e6


def fit_map(dim: int, work_us: float) -> tuple[int, float]:
    """The number of rounds whose map costs about ``work_us`` per record."""
    base = map_cost_us(dim, 0)
    per_round = (map_cost_us(dim, 20) - base) / 20
    rounds = max(0, round((work_us - base) / max(per_round, 1e-3)))
    return rounds, map_cost_us(dim, rounds)


def make_step(dim: int, hidden: int):
    key = jax.random.PRNGKey(0)
    w = jax.random.normal(key, (dim, hidden), jnp.float32) / dim**0.5
    v = jax.random.normal(key, (hidden, hidden), jnp.float32) / hidden**0.5

    @jax.jit
    def step(batch):
        h = jnp.tanh(batch["x"] @ w)
        h = jnp.tanh(h @ v)
        return jnp.mean(h) + jnp.mean(batch["label"])

    return step


def make_host_free_step(seconds: float):
    """An accelerator-like step: reads the batch, then leaves the host CPU idle."""
    touch = jax.jit(lambda batch: jnp.mean(batch["x"]) + jnp.mean(batch["label"]))

    class Waiting:
        def __init__(self, value):
            self.value = value

        def block_until_ready(self):
            self.value.block_until_ready()
            time.sleep(seconds)

    return lambda batch: Waiting(touch(batch))


def time_step(step, batch, repeats: int = 30) -> float:
    batch = jax.device_put(batch)
    step(batch).block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
        step(batch).block_until_ready()
    return (time.perf_counter() - start) / repeats


def fit_step(batch_size: int, dim: int, step_ms: float):
    """The hidden width whose step takes about ``step_ms`` on this machine."""
    batch = {"x": np.ones((batch_size, dim), np.float32), "label": np.zeros(batch_size, np.int32)}
    hidden = 256
    for _ in range(6):
        seconds = time_step(make_step(dim, hidden), batch)
        if abs(seconds * 1e3 - step_ms) < 0.1 * step_ms:
            break
        hidden = max(64, int(hidden * (step_ms / (seconds * 1e3)) ** 0.5) // 32 * 32)
    step = make_step(dim, hidden)
    return step, hidden, time_step(step, batch)


def make_loader(args, rounds: int) -> dl.DataLoader:
    n = 1 << 30
    return dl.DataLoader(
        dl.RangeDataSource(n),
        dl.IndexSampler(n, shuffle=True, seed=0, num_epochs=1),
        [dl.MapTransform(make_map(args.dim, rounds)), dl.Batch(args.batch, drop_remainder=True)],
        worker_count=args.workers,
    )


def loader_alone(args, rounds: int) -> float:
    """Records per second of the loader with no step (after its start-up)."""
    it = iter(make_loader(args, rounds))
    try:
        for _ in itertools.islice(it, args.warmup):
            pass
        start = time.perf_counter()
        for _ in itertools.islice(it, args.steps):
            pass
        return args.steps * args.batch / (time.perf_counter() - start)
    finally:
        it.close()


def run(step, args, rounds: int, with_queue: bool) -> dict:
    """Runs the loop; the time spent getting each batch is the time the step waited."""
    loader = make_loader(args, rounds)
    device = jax.local_devices()[0]
    if with_queue:
        it = dl.device_prefetch(loader, device, cpu_buffer_size=args.cpu_buffer,
                                device_buffer_size=args.device_buffer)

        def get():
            return next(it)
    else:
        it = iter(loader)

        def get():
            return jax.device_put(next(it), device)
    try:
        for _ in range(args.warmup):
            step(get()).block_until_ready()
        waits = []
        start = time.perf_counter()
        for _ in range(args.steps):
            t0 = time.perf_counter()
            batch = get()
            waits.append(time.perf_counter() - t0)
            step(batch).block_until_ready()
            del batch  # freeing the last batch is the loop's cost, not a wait for data
        wall = time.perf_counter() - start
    finally:
        it.close()
    w = np.asarray(waits) * 1e3
    return {"wait": w.sum() / 1e3 / wall, "p50": np.median(w), "p90": np.percentile(w, 90),
            "rate": args.steps * args.batch / wall, "ms_step": wall / args.steps * 1e3}


def first_batch(args, rounds: int, with_queue: bool) -> float:
    """Seconds from building the loader to its first batch ready on the device."""
    device = jax.local_devices()[0]
    start = time.perf_counter()
    loader = make_loader(args, rounds)
    if with_queue:
        it = dl.device_prefetch(loader, device, cpu_buffer_size=args.cpu_buffer,
                                device_buffer_size=args.device_buffer)
        batch = next(it)
    else:
        it = iter(loader)
        batch = jax.device_put(next(it), device)
    jax.block_until_ready(batch)
    seconds = time.perf_counter() - start
    it.close()
    return seconds


def transfer_rates(args) -> tuple[float, float, int]:
    """Bytes/s into the device of the same host batches: a bare ``jax.device_put`` loop
    (``device_buffer`` transfers in flight) against ``device_prefetch`` consumed by a
    loop that waits for each batch."""
    device = jax.local_devices()[0]
    rows = max(1, int(args.transfer_mb * 2**20 / (4 * args.dim)))
    rng = np.random.default_rng(0)
    batches = [{"x": rng.standard_normal((rows, args.dim), dtype=np.float32),
                "label": np.arange(rows, dtype=np.int32)} for _ in range(8)]
    nbytes = sum(leaf.nbytes for leaf in batches[0].values())
    count = args.transfer_batches

    def stream():
        return (batches[i % len(batches)] for i in range(count))

    jax.block_until_ready(jax.device_put(batches[0], device))  # warm the transfer path
    depth = args.device_buffer
    start = time.perf_counter()
    in_flight: list = []
    for batch in stream():  # as many transfers in flight as the feed's device buffer
        in_flight.append(jax.device_put(batch, device))
        if len(in_flight) > depth:
            jax.block_until_ready(in_flight.pop(0))
    jax.block_until_ready(in_flight)
    bare = count * nbytes / (time.perf_counter() - start)
    start = time.perf_counter()
    with dl.device_prefetch(stream(), device, cpu_buffer_size=args.cpu_buffer,
                            device_buffer_size=args.device_buffer) as it:
        for batch in it:
            jax.block_until_ready(batch)
    fed = count * nbytes / (time.perf_counter() - start)
    return bare, fed, nbytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--dim", type=int, default=256, help="features per record (float32)")
    parser.add_argument("--step-ms", type=float, default=5.0, help="target cost of one step")
    parser.add_argument("--map-us", type=float, default=30.0, help="map work per record")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--cpu-buffer", type=int, default=2)
    parser.add_argument("--device-buffer", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2, help="rounds over the rows")
    parser.add_argument("--transfer-mb", type=float, default=12.6,
                        help="size of the batches of the transfer rows (the issue's 12.6 MB)")
    parser.add_argument("--transfer-batches", type=int, default=200)
    parser.add_argument("--steps-kind", default="matmul,host-free",
                        help="matmul: XLA on this CPU, sharing its cores with the loader; "
                             "host-free: a step that leaves the host idle, as on an accelerator")
    args = parser.parse_args()

    matmul, hidden, step_s = fit_step(args.batch, args.dim, args.step_ms)
    demand = args.batch / step_s
    rounds, map_us = fit_map(args.dim, args.map_us)
    supply = loader_alone(args, rounds)
    print(f"device: {jax.local_devices()[0]} ({jax.device_count()} devices, jax {jax.__version__}), "
          f"{os.cpu_count()} CPUs")
    print(f"step: matmuls {args.batch}x{args.dim} @ {args.dim}x{hidden} @ {hidden}x{hidden}, "
          f"{step_s * 1e3:.2f} ms alone -> demand {demand:,.0f} records/s")
    print(f"loader: {args.workers} workers, map {map_us:.0f} us/record, Batch({args.batch}) -> "
          f"{supply:,.0f} records/s alone ({supply / demand:.2f}x the step's demand)")
    steps = {"matmul": matmul, "host-free": make_host_free_step(step_s)}
    rows = [("loader + device_put", False),
            (f"device_prefetch(cpu={args.cpu_buffer}, dev={args.device_buffer})", True)]
    print(f"{'step':<10}{'feed':<32}{'wait %':>8}{'p50 ms':>8}{'p90 ms':>8}"
          f"{'ms/step':>9}{'records/s':>11}")
    for _ in range(args.repeat):
        plain = float(np.median([first_batch(args, rounds, False) for _ in range(7)]))
        queued = float(np.median([first_batch(args, rounds, True) for _ in range(7)]))
        print(f"first batch on the device (median of 7): loader + device_put {plain:.3f} s, "
              f"device_prefetch {queued:.3f} s ({queued / plain:.2f}x)")
        bare, fed, nbytes = transfer_rates(args)
        print(f"transfer of {nbytes / 2**20:.1f} MiB batches: bare jax.device_put loop "
              f"{bare / 2**30:.2f} GiB/s, device_prefetch {fed / 2**30:.2f} GiB/s "
              f"({fed / bare:.2f}x)")
        for kind in args.steps_kind.split(","):
            for name, with_queue in rows:
                r = run(steps[kind], args, rounds, with_queue)
                print(f"{kind:<10}{name:<32}{r['wait'] * 100:>7.2f}%{r['p50']:>8.3f}"
                      f"{r['p90']:>8.3f}{r['ms_step']:>9.2f}{r['rate']:>11,.0f}")


if __name__ == "__main__":
    main()
