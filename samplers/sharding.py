"""Which part of the global record stream one host reads.

Shard ``h`` of ``H`` owns the global positions ``g`` with ``g % H == h``: its local
position ``p`` is global position ``p * H + h``. The interleaving runs over the
whole multi-epoch stream (after the global shuffle), so every host draws from the
whole data set, the shards of one epoch together read that epoch exactly once, and
with a per-host batch ``B`` the ``k``-th global batch is the global positions
``[k * B * H, (k + 1) * B * H)`` whatever ``H`` is.

Example:
    >>> options = ShardOptions(shard_index=1, shard_count=4)
    >>> shard_length(10, options.shard_index, options.shard_count, options.drop_remainder)
    3
"""

from __future__ import annotations

import dataclasses


def shard_length(total: int, shard_index: int, shard_count: int, drop_remainder: bool) -> int:
    """Returns how many of the global positions ``[0, total)`` belong to one shard.

    Args:
        total: Length of the global stream, ``>= 0``.
        shard_index: The shard, in ``[0, shard_count)``.
        shard_count: Number of shards, ``>= 1``.
        drop_remainder: If true every shard gets ``total // shard_count`` positions,
            so all shards have the same length; otherwise shard ``h`` gets every
            ``g < total`` with ``g % shard_count == h``, i.e.
            ``ceil((total - h) / shard_count)``.

    Returns:
        The number of local positions of the shard.
    """
    if drop_remainder:
        return total // shard_count
    return max(0, -(-(total - shard_index) // shard_count))


def _check_int(name: str, value: object, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} must be an int, got {value!r} of type {type(value).__name__}; {hint}"
        )


@dataclasses.dataclass(frozen=True, eq=False)
class ShardOptions:
    """Shard ``shard_index`` of ``shard_count`` of the global record stream.

    Options compare equal (and hash alike) when their three fields are equal, so
    ``NoSharding() == ShardOptions(0, 1)``. Change them with ``dataclasses.replace``.

    Attributes:
        shard_index: This shard, in ``[0, shard_count)``.
        shard_count: Number of shards (hosts), ``>= 1``.
        drop_remainder: If true, every shard gets ``total // shard_count``
            positions of a finite stream and the last ``total % shard_count``
            global positions are read by nobody, so all hosts take the same number
            of steps. If false, the first ``total % shard_count`` shards get one
            position more.

    Example:
        >>> ShardOptions(shard_index=0, shard_count=2, drop_remainder=True)
        ShardOptions(shard_index=0, shard_count=2, drop_remainder=True)
    """

    shard_index: int
    shard_count: int
    drop_remainder: bool = False

    def __post_init__(self) -> None:
        _check_int(
            "shard_count",
            self.shard_count,
            "pass the number of shards, e.g. shard_count=jax.process_count()",
        )
        _check_int(
            "shard_index",
            self.shard_index,
            "pass this shard's index, e.g. shard_index=jax.process_index()",
        )
        if not isinstance(self.drop_remainder, bool):
            raise TypeError(
                f"drop_remainder must be a bool, got {self.drop_remainder!r} of type "
                f"{type(self.drop_remainder).__name__}; pass True or False"
            )
        if self.shard_count < 1:
            raise ValueError(
                f"shard_count must be at least 1, got {self.shard_count}; use 1 for no sharding"
            )
        if not 0 <= self.shard_index < self.shard_count:
            raise ValueError(
                f"shard_index must be in [0, shard_count) = [0, {self.shard_count}), got "
                f"{self.shard_index}; shards are numbered from 0"
            )

    def _key(self) -> tuple[int, int, bool]:
        return (self.shard_index, self.shard_count, self.drop_remainder)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardOptions):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


@dataclasses.dataclass(frozen=True, eq=False)
class NoSharding(ShardOptions):
    """The whole stream on one shard: shard 0 of 1.

    Example:
        >>> NoSharding() == ShardOptions(shard_index=0, shard_count=1)
        True
    """

    shard_index: int = dataclasses.field(default=0, init=False)
    shard_count: int = dataclasses.field(default=1, init=False)
    drop_remainder: bool = False


@dataclasses.dataclass(frozen=True, eq=False)
class ShardByJaxProcess(ShardOptions):
    """One shard per JAX process: ``jax.process_index()`` of ``jax.process_count()``.

    The two numbers are read once, at construction (so call
    ``jax.distributed.initialize`` first); a pickled copy keeps them. JAX is
    imported only here, so the rest of the package does not need it.

    Example:
        >>> options = ShardByJaxProcess()  # doctest: +SKIP
        >>> options.shard_index, options.shard_count  # doctest: +SKIP
        (0, 1)
    """

    shard_index: int = dataclasses.field(init=False)
    shard_count: int = dataclasses.field(init=False)
    drop_remainder: bool = False

    def __post_init__(self) -> None:
        import jax  # lazily: only this class needs JAX

        object.__setattr__(self, "shard_index", int(jax.process_index()))
        object.__setattr__(self, "shard_count", int(jax.process_count()))
        super().__post_init__()
