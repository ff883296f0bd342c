"""A token-weighted mixture restored elastically: is the job's token accounting exact?

``IterDataset.mix(..., weight_by="tokens")`` on H hosts, each over its shard of three
sources of very different lengths (1-63, 100-2,047 and 8-512 tokens), weights
0.2/0.3/0.5. The old hosts draw unequal numbers of elements (400, 470, 540, ...), save,
and the job restores on H' hosts (every old host's states to each new host), which draw
50, then 400, then 4,000 more elements each. Printed per restore: the job's token counts
the old hosts' states hold, the sum of the new hosts' counts right after the restore,
and at each point the tokens of the job so far, the largest difference between a
source's share of them and its weight (with the bound (H + H') * max_length / T), and
the largest difference between what the new hosts' states count and the tokens of the
records the hosts handed out (0: exact). Every record is checked to be used at most once.

    python benchmarks/token_mix_elastic.py
"""

from __future__ import annotations

import json

import numpy as np

import dataloader as dl

SPANS = [(1, 64), (100, 2048), (8, 513)]
WEIGHTS = [0.2, 0.3, 0.5]
MAX_LENGTH = max(high for _, high in SPANS) - 1


def length(element: int) -> int:
    c, k = divmod(int(element), 10**6)
    low, high = SPANS[c]
    return low + (k * 2654435761 + c * 97) % (high - low)


def host(h: int, count: int):
    sources = [dl.MapDataset.range(c * 10**6, c * 10**6 + 10**6).to_iter_dataset(shard_options=dl.ShardOptions(h, count))
               for c in range(len(SPANS))]
    return iter(dl.IterDataset.mix(sources, WEIGHTS, weight_by="tokens", length=length))


def take(it, n: int) -> list[int]:
    return [next(it) for _ in range(n)]


def restore(old: int, new: int) -> None:
    hosts = [host(h, old) for h in range(old)]
    used = [x for i, it in enumerate(hosts) for x in take(it, 400 + 70 * i)]
    states = [json.loads(json.dumps(it.get_state())) for it in hosts]
    restored = [host(h, new) for h in range(new)]
    for it in restored:
        it.set_state(states)
    before = np.sum([s["tokens"] for s in states], axis=0)
    after = np.sum([it.get_state()["tokens"] for it in restored], axis=0)
    print(f"{old} -> {new} hosts: the old hosts' states count {before.tolist()} tokens, the new hosts' "
          f"{after.tolist()} right after the restore")
    for step in (50, 400, 4000):
        for it in restored:
            used += take(it, step)
        assert len(set(used)) == len(used), "a record was used twice"
        counted = np.zeros(len(WEIGHTS))
        for e in used:
            counted[e // 10**6] += length(e)
        stated = np.sum([it.get_state()["tokens"] for it in restored], axis=0)
        total = counted.sum()
        print(f"  T = {int(total):>9,} tokens: largest share error {np.abs(counted / total - WEIGHTS).max():.3%} "
              f"(bound {(old + new) * MAX_LENGTH / total:.3%}); states minus handed out "
              f"{int(np.abs(stated - counted).max()):,} tokens")


def main() -> None:
    for old, new in ((2, 3), (3, 1)):
        restore(old, new)


if __name__ == "__main__":
    main()
