"""``device_put``: the device feed for a dataset, in the chained style.

A thin call to :func:`dataloader.device.feed.device_prefetch`, imported on first use so that
``import dataloader`` never imports JAX.
"""

from __future__ import annotations

from typing import Any


def device_put(
    ds: Any,
    device: Any = None,
    *,
    cpu_buffer_size: int = 2,
    device_buffer_size: int = 2,
) -> Any:
    """Feeds a dataset's batches to devices a few steps ahead; checkpointable.

    Args:
        ds: an ``IterDataset`` (iterated from the start), a ``MapDataset`` (its
            ``to_iter_dataset()``), or an iterator with ``get_state``/``set_state``
            such as ``iter(ds)``.
        device: ``None`` (the first local device), a ``jax.Device`` or a
            ``jax.sharding.Sharding`` (Grain's ``device=`` argument).
        cpu_buffer_size: batches kept ready on the host by a background thread.
        device_buffer_size: batches kept already transferred.

    Returns:
        The :class:`~dataloader.device.feed.DeviceIterator`; its state is the state of the
        last batch it handed out.

    Example:
        >>> import dataloader as dl
        >>> ds = dl.MapDataset.range(8).batch(4).to_iter_dataset()
        >>> [int(b.sum()) for b in dl.device_put(ds)]
        [6, 22]
    """
    from dataloader.dataset.iter_dataset import IterDataset
    from dataloader.dataset.map_dataset import MapDataset
    from dataloader.device.feed import device_prefetch

    if isinstance(ds, MapDataset):
        ds = ds.to_iter_dataset()
    source = iter(ds) if isinstance(ds, IterDataset) else ds
    return device_prefetch(
        source,
        device,
        cpu_buffer_size=cpu_buffer_size,
        device_buffer_size=device_buffer_size,
    )
