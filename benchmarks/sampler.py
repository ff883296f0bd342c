"""Sampler throughput: record indices per second for a huge shuffled data set.

Target (issue 2): at least 20 million indices per second for n = 10**9.
"""

from __future__ import annotations

import time

import numpy as np


def sampler_throughput(n: int = 10**9, chunk: int = 1 << 20, seconds: float = 2.0) -> dict:
    """Times ``IndexSampler.record_keys`` on consecutive chunks of positions."""
    from dataloader.samplers import IndexSampler

    sampler = IndexSampler(n, shuffle=True, seed=0)
    sampler.record_keys(np.arange(chunk, dtype=np.int64))  # warm the round keys
    done, start, began = 0, 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        sampler.record_keys(np.arange(start, start + chunk, dtype=np.int64))
        start += chunk
        done += chunk
    bulk = done / (time.perf_counter() - began)
    # The loader's own call: one batch of 128 positions.
    positions = np.arange(128, dtype=np.int64)
    reps, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds / 2:
        sampler.record_keys(positions + reps * 128)
        reps += 1
    per_batch_us = (time.perf_counter() - began) / reps * 1e6
    return {"n": n, "indices_per_s": bulk, "batch128_us": per_batch_us}


def format_result(r: dict) -> str:
    return (
        f"== sampler: IndexSampler(n={r['n']:.0e}, shuffle=True).record_keys\n"
        f"bulk (chunks of 2**20 positions): {r['indices_per_s'] / 1e6:.1f} M indices/s "
        f"(target >= 20 M/s)\n"
        f"one batch of 128 positions: {r['batch128_us']:.1f} us "
        f"({r['batch128_us'] / 128:.2f} us per record)"
    )


if __name__ == "__main__":
    print(format_result(sampler_throughput()))
