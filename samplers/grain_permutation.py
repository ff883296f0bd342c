"""Grain's own shuffle order, as an option: ``IndexSampler(..., permutation="grain")``.

Grain's ``MapDataset.shuffle`` puts record ``index_shuffle(o, n - 1, (seed + e) mod
2**32, rounds=4)`` at offset ``o`` of epoch ``e``, where ``index_shuffle`` (a C++ op in
Grain) is a Simon block cipher with cycle walking. This module computes the same
values with numpy, vectorised over many offsets, so a pipeline moved from Grain can
read its records in the very same order:

* **Block.** ``B`` bits, the even number at least ``ceil(log2(max_index))`` and at least
  16 (``log2`` of ``max_index`` itself, in doubles, as Grain computes it); the value is
  split into two words of ``W = B / 2`` bits, ``left = value >> W`` (kept to ``W``
  bits) and ``right`` the low ``W`` bits.
* **Rounds.** Round keys are ``std::seed_seq{seed}.generate(rounds)`` (the algorithm the
  C++ standard specifies, written out below), each used modulo ``2**W``. A pair of
  rounds does ``left ^= f(right) ^ k[i]``, then ``right ^= f(left) ^ k[i + 1]``, with
  ``f(x) = (rotl(x, 1) & rotl(x, 8)) ^ rotl(x, 2)`` on ``W``-bit words.
* **Cycle walking.** The block is encrypted again until it is ``<= max_index``.

Checked against grain 0.2.18's ``index_shuffle`` for domains from 1 to 2**62 + 11,
seeds across ``[0, 2**32)`` and 4 or 8 rounds (every value equal), and against its
``MapDataset.shuffle`` over several epochs. One quirk comes along: when ``max_index``
is ``2**k`` for an even ``k >= 16``, the block has ``k`` bits, so ``max_index`` itself
does not fit and is read as a smaller value; Grain's order then repeats one record and
leaves one out in each epoch, and so does this one.

Example:
    >>> grain_permute(np.arange(5), n=5, seed=0, epoch=0).tolist()  # Grain's order too
    [0, 4, 1, 2, 3]
"""

from __future__ import annotations

import functools
import math

import numpy as np

GRAIN_ROUNDS = 4
"""Rounds Grain's ``MapDataset.shuffle`` asks ``index_shuffle`` for."""

_MASK32 = 0xFFFFFFFF


@functools.lru_cache(maxsize=256)
def seed_seq_words(seed: int, count: int) -> tuple[int, ...]:
    """``std::seed_seq{seed}.generate(count)``: ``count`` 32-bit words, as the C++
    standard defines the algorithm ([rand.util.seedseq])."""
    entropy = [seed & _MASK32]
    s, n = len(entropy), count
    words = [0x8B8B8B8B] * n
    t = 11 if n >= 623 else 7 if n >= 68 else 5 if n >= 39 else 3 if n >= 7 else (n - 1) // 2
    p = (n - t) // 2
    q = p + t
    m = max(s + 1, n)

    def mix(x: int) -> int:
        return x ^ (x >> 27)

    for k in range(m):
        r1 = (1664525 * mix(words[k % n] ^ words[(k + p) % n] ^ words[(k - 1) % n])) & _MASK32
        r2 = (r1 + (s if k == 0 else k % n + entropy[k - 1] if k <= s else k % n)) & _MASK32
        words[(k + p) % n] = (words[(k + p) % n] + r1) & _MASK32
        words[(k + q) % n] = (words[(k + q) % n] + r2) & _MASK32
        words[k % n] = r2
    for k in range(m, m + n):
        r3 = (1566083941 * mix((words[k % n] + words[(k + p) % n] + words[(k - 1) % n]) & _MASK32)) & _MASK32
        r4 = (r3 - k % n) & _MASK32
        words[(k + p) % n] ^= r3
        words[(k + q) % n] ^= r4
        words[k % n] = r4
    return tuple(words)


def _word_bits(max_index: int) -> int:
    bits = math.ceil(math.log2(max_index))
    return max(bits + bits % 2, 16) // 2


def grain_index_shuffle(indices: np.ndarray, max_index: int, seed: int, rounds: int) -> np.ndarray:
    """Grain's ``index_shuffle`` of each index of ``indices`` (in ``[0, max_index]``).

    Args:
        indices: integer array of any shape.
        max_index: the largest index of the domain, ``[0, 2**63)``.
        seed: the key, ``[0, 2**32)``.
        rounds: an even number of rounds in ``[4, 1024]``.

    Returns:
        An int64 array of the shape of ``indices``.
    """
    values = np.asarray(indices).astype(np.uint64)
    if max_index == 0:
        return np.zeros(values.shape, np.int64)
    w = _word_bits(max_index)
    if w <= _TABLE_WORD_BITS:  # a small block: walks are long, a table of it is small
        # (max_index itself may not fit the block: like Grain, keep the block's bits)
        return _small_table(max_index, seed, rounds)[(values & np.uint64((1 << 2 * w) - 1)).astype(np.int64)]
    out = values.reshape(-1).copy()
    todo = np.arange(out.size)
    while todo.size:  # cycle walking: only the values still past max_index go round again
        out[todo] = _encrypt(out[todo], w, seed, rounds)
        todo = todo[out[todo] > np.uint64(max_index)]
    return out.astype(np.int64).reshape(values.shape)


# Blocks of up to 2 * 10 bits are laid out whole. Grain's block has at least 16 bits,
# so a domain of n records walks about 65536 / n steps per value: for n = 37 that was
# 18 s for 111 values walked one step per numpy pass, against 3 ms for the table.
_TABLE_WORD_BITS = 10


@functools.lru_cache(maxsize=8)  # one table per (n, epoch seed): up to 8 MiB each
def _small_table(max_index: int, seed: int, rounds: int) -> np.ndarray:
    """``index_shuffle`` of every value of a small block (read for ``[0, max_index]``).

    Each value's walk is resolved by pointer jumping: ``ahead[x]`` is a point of the
    walk from ``x`` with nothing in range strictly before it; an ``ahead[x]`` still out
    of range jumps to ``ahead[ahead[x]]``, doubling the distance covered each pass. A
    walk is at most ``2**(2w)`` steps, so ``2w + 1`` passes resolve every value in
    range (values on cycles with none in range never resolve, and are never read).
    """
    w = _word_bits(max_index)
    ahead = _encrypt(np.arange(1 << (2 * w), dtype=np.uint64), w, seed, rounds).astype(np.int64)
    out = np.flatnonzero(ahead > max_index)
    for _ in range(2 * w + 1):
        if not out.size:
            break
        ahead[out] = ahead[ahead[out]]
        out = out[ahead[out] > max_index]
    table = ahead[: max_index + 1].copy()
    table.flags.writeable = False
    return table


def _encrypt(x: np.ndarray, w: int, seed: int, rounds: int) -> np.ndarray:
    """One pass of the Simon cipher over ``2 * w``-bit blocks (uint64 in, uint64 out)."""
    mask, shift = np.uint64((1 << w) - 1), np.uint64(w)
    keys = [np.uint64(k & ((1 << w) - 1)) for k in seed_seq_words(seed, rounds)]
    turns = [(np.uint64(r), np.uint64(w - r)) for r in (1, 8, 2)]

    def f(v: np.ndarray) -> np.ndarray:
        (a, a_), (b, b_), (c, c_) = turns
        return ((((v << a) | (v >> a_)) & ((v << b) | (v >> b_))) ^ ((v << c) | (v >> c_))) & mask

    left, right = (x >> shift) & mask, x & mask
    for i in range(0, rounds, 2):
        left ^= f(right) ^ keys[i]
        right ^= f(left) ^ keys[i + 1]
    return (left << shift) | right


def grain_permute(offsets: np.ndarray, n: int, seed: int, epoch: int) -> np.ndarray:
    """The record at each offset of epoch ``epoch`` of Grain's ``MapDataset.shuffle(seed)``
    over ``n`` records: ``index_shuffle(o, n - 1, (seed + epoch) mod 2**32, 4)``."""
    return grain_index_shuffle(offsets, n - 1, (seed + epoch) % 2**32, GRAIN_ROUNDS)
