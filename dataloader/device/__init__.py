"""The device feed: batches prefetched onto accelerators, placed on one device, a
sharding over local devices, or one global array across JAX processes. Imports JAX."""

from dataloader.device.ends import end_together
from dataloader.device.feed import DeviceIterator, device_prefetch
from dataloader.device.placement import Placement

__all__ = ["DeviceIterator", "Placement", "device_prefetch", "end_together"]
