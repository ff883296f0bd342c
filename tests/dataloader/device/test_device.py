"""The device feed: placement, values, state with full buffers, bad input, shutdown.

The sharded tests need several devices; on CPU, JAX makes them when
``jax_num_cpu_devices`` is set before its backend starts. This module sets it when it is
imported (pytest imports every test module before running any test), and the ``cpus``
fixture fails with a clear message if a backend had started earlier.
"""

from __future__ import annotations

import contextlib
import gc
import json
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import dataloader as dl
from tests.dataloader.pipelines import as_dict
from tests.helpers import assert_restores_everywhere, assert_streams_equal, wait_full, wait_until
from tests.integration.conftest import child_pids

DEVICES = 4
if jax.config.jax_num_cpu_devices < DEVICES:
    with contextlib.suppress(RuntimeError):  # a backend already started: see `cpus`
        jax.config.update("jax_num_cpu_devices", DEVICES)

FEED = "granary-device"


@pytest.fixture
def cpus():
    devices = jax.devices("cpu")
    assert len(devices) >= DEVICES, (
        f"these tests need {DEVICES} CPU devices but JAX has {len(devices)}: its backend "
        f"started before this module could set jax_num_cpu_devices; run them alone or set "
        f"XLA_FLAGS=--xla_force_host_platform_device_count={DEVICES}"
    )
    return devices[:DEVICES]


@pytest.fixture
def sharding(cpus):
    return NamedSharding(Mesh(np.array(cpus), ("data",)), PartitionSpec("data"))


def make_loader(n=64, batch=8, workers=0, epochs=1):
    return dl.DataLoader(
        dl.RangeDataSource(n), dl.IndexSampler(n, shuffle=True, seed=7, num_epochs=epochs),
        [dl.MapTransform(as_dict), dl.Batch(batch)], worker_count=workers,
    )


def to_numpy(tree):
    return jax.tree_util.tree_map(np.asarray, tree)


def feed_threads():
    return [t for t in threading.enumerate() if t.name.startswith(FEED)]


class AsNumpy:
    """A device iterator whose outputs come back to numpy, for the stream helpers."""

    def __init__(self, it):
        self.it = it

    def __iter__(self):
        return self

    def __next__(self):
        return to_numpy(next(self.it))

    def get_state(self):
        return self.it.get_state()

    def set_state(self, state):
        self.it.set_state(state)

    def close(self):
        self.it.close()


class ListIterator:
    """An iterator over given batches, with get_state/set_state (the Dataset protocol)."""

    def __init__(self, batches):
        self.batches, self.i = batches, 0

    def __next__(self):
        if self.i >= len(self.batches):
            raise StopIteration
        self.i += 1
        return self.batches[self.i - 1]

    def get_state(self):
        return {"i": self.i}

    def set_state(self, state):
        self.i = state["i"]


# -- placement and values -------------------------------------------------------------


def test_leaves_are_jax_arrays_with_the_requested_sharding(sharding):
    with dl.device_prefetch(make_loader(), sharding) as it:
        batch = next(it)
    leaf = batch["x"]
    assert isinstance(leaf, jax.Array)
    assert leaf.sharding == sharding
    assert leaf.shape == (8, 2)
    assert sorted(s.data.shape for s in leaf.addressable_shards) == [(2, 2)] * DEVICES


def test_values_equal_the_loaders_numpy_batches(sharding):
    expected = list(make_loader())
    with dl.device_prefetch(make_loader(), sharding) as it:
        got = [to_numpy(b) for b in it]
    assert len(got) == len(expected) == 8
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g["x"], e["x"])


def test_default_target_is_this_processs_first_device(cpus):
    with dl.device_prefetch(make_loader()) as it:
        assert next(it)["x"].devices() == {jax.local_devices()[0]}


def test_a_device_target_places_every_leaf_on_it(cpus):
    with dl.device_prefetch(make_loader(), cpus[2]) as it:
        assert next(it)["x"].devices() == {cpus[2]}


def test_any_iterator_of_pytrees_is_fed_with_its_structure(cpus):
    # int32 and float32: JAX without x64 would narrow 64-bit leaves.
    batches = [({"a": np.full((4, 3), i, np.int32)}, [np.arange(4, dtype=np.float32) + i])
               for i in range(3)]
    with dl.device_prefetch(iter(batches), cpus[1]) as it:
        got = [to_numpy(b) for b in it]
    assert_streams_equal(got, batches)


def test_both_buffers_fill_ahead_of_the_consumer(cpus):
    """3 batches wait on the host and 2 are already jax.Arrays, before any is asked for."""
    with dl.device_prefetch(make_loader(), cpus[0], cpu_buffer_size=3, device_buffer_size=2) as it:
        wait_full(it)
        host, device = list(it._res.feed.host.queue), list(it._res.feed.device)
        assert it.get_state() == make_loader().iterator().get_state()
    assert len(host) == 3 and all(isinstance(b["x"], np.ndarray) for _, b, _ in host)
    assert len(device) == 2 and all(isinstance(b["x"], jax.Array) for _, b, _ in device)
    assert [s["position"] for _, _, s in device + host] == [8, 16, 24, 32, 40]


# -- state ----------------------------------------------------------------------------


def test_get_state_after_k_batches_equals_the_loaders_even_with_full_buffers(sharding):
    reference = iter(make_loader(epochs=2))
    expected = [reference.get_state()] + [(next(reference), reference.get_state())[1] for _ in range(10)]
    with dl.device_prefetch(make_loader(epochs=2), sharding, cpu_buffer_size=2) as it:
        assert it.get_state() == expected[0]
        for k in range(1, 11):
            next(it)
            wait_full(it)
            assert it.get_state() == expected[k], f"after {k} batches"


def test_restore_with_full_buffers_into_a_fresh_iterator_continues_exactly(sharding):
    """Saved while both buffers are full (workers busy too), the continuation is identical."""
    loader = make_loader(n=96, workers=2)
    with dl.device_prefetch(loader, sharding) as it:
        everything = [to_numpy(b) for b in it]
    saved = {}
    with dl.device_prefetch(loader, sharding) as it:
        for k in range(1, 9):
            next(it)
            wait_full(it)  # 12 batches: at k = 8, four are left, enough to fill both
            saved[k] = json.dumps(it.get_state())
    for k in (1, 3, 6, 8):
        with dl.device_prefetch(loader.iterator(), sharding) as fresh:
            fresh.set_state(json.loads(saved[k]))
            assert_streams_equal([to_numpy(b) for b in fresh], everything[k:])
    assert wait_until(lambda: not child_pids())


def test_restores_at_every_step_including_epoch_boundaries(sharding):
    loader = make_loader(n=40, epochs=2)
    assert_restores_everywhere(lambda: AsNumpy(dl.device_prefetch(loader, sharding)), limit=11)


def test_state_at_the_end_equals_the_exhausted_loaders():
    reference = iter(make_loader(n=20))
    list(reference)
    with dl.device_prefetch(make_loader(n=20)) as it:
        assert len(list(it)) == 3
        with pytest.raises(StopIteration):
            next(it)
        assert it.get_state() == reference.get_state()


def test_an_iterator_with_state_restores_through_the_feed(cpus):
    batches = [np.full((4,), i) for i in range(6)]
    with dl.device_prefetch(ListIterator(batches), cpus[0]) as it:
        next(it), next(it)
        state = it.get_state()
    assert state == {"i": 2}
    with dl.device_prefetch(ListIterator(batches), cpus[0]) as it:
        it.set_state(state)
        assert [int(b[0]) for b in it] == [2, 3, 4, 5]


def test_get_state_without_a_source_state_says_what_to_pass(cpus):
    with dl.device_prefetch(iter([np.zeros(4)]), cpus[0]) as it, pytest.raises(
        TypeError, match=r"has no get_state\(\), so the device iterator cannot be checkpointed"
    ):
        it.get_state()


# -- bad input ------------------------------------------------------------------------


def test_a_batch_that_does_not_divide_over_the_mesh_axis_names_leaf_and_shape(sharding):
    with dl.device_prefetch(make_loader(batch=6), sharding) as it, pytest.raises(
        ValueError,
        match=r"leaf \['x'\] has shape \(6, 2\), dtype int64: its axis 0 of size 6 does not "
        r"divide over the 4 devices of mesh axis 'data' \(4\).*multiple of 4",
    ):
        next(it)


def test_a_short_last_batch_fails_at_its_place_in_the_stream(sharding):
    """18 records in batches of 8: two batches come out, the third (2 rows) is refused."""
    with dl.device_prefetch(make_loader(n=18), sharding) as it:
        assert len([next(it), next(it)]) == 2
        with pytest.raises(ValueError, match=r"axis 0 of size 2 does not divide.*drop_remainder=True"):
            next(it)
        with pytest.raises(StopIteration):
            next(it)


@pytest.mark.parametrize(
    ("leaf", "described"),
    [
        (np.array(["a", "b", "c", "d"]), r"shape \(4,\), dtype <U1"),
        (np.array([b"a", b"b", b"c", b"d"]), r"shape \(4,\), dtype \|S1"),
        (np.array([{}, None, 1, "x"], dtype=object), r"shape \(4,\), dtype object"),
        (b"raw bytes", r"a bytes: \"b'raw bytes'\""),
    ],
    ids=["str", "bytes", "object", "bytes_scalar"],
)
def test_a_non_numeric_leaf_is_refused_by_name(cpus, leaf, described):
    batches = [{"ok": np.zeros(4), "text": leaf}]
    with dl.device_prefetch(iter(batches), cpus[0]) as it, pytest.raises(
        TypeError, match=rf"leaf \['text'\] is not numeric \({described}\)"
    ):
        next(it)


def test_ragged_leaves_are_refused_naming_both_shapes(sharding):
    batches = [{"image": np.zeros((8, 2)), "label": np.zeros((6,))}]
    with dl.device_prefetch(iter(batches), sharding) as it, pytest.raises(
        ValueError,
        match=r"leaf \['image'\] has shape \(8, 2\) and leaf \['label'\] has shape \(6,\) \(ragged\)",
    ):
        next(it)


def test_a_scalar_leaf_cannot_be_split_over_devices(sharding):
    with dl.device_prefetch(iter([{"n": np.int32(3)}]), sharding) as it, pytest.raises(
        ValueError, match=r"leaf \['n'\] is a scalar .* batch the records first"
    ):
        next(it)


def test_a_pipeline_error_reaches_the_consumer_at_its_place_with_its_type(cpus):
    def fail_on_21(x):
        if x == 21:
            raise KeyError("bad record")
        return x

    loader = dl.DataLoader(dl.RangeDataSource(40), dl.SequentialSampler(40),
                           [dl.MapTransform(fail_on_21), dl.Batch(4)])
    with dl.device_prefetch(loader, cpus[0]) as it:
        good = [next(it) for _ in range(5)]
        with pytest.raises(dl.PipelineError, match="21") as caught:
            next(it)
    assert [int(b[0]) for b in good] == [0, 4, 8, 12, 16]
    assert isinstance(caught.value.__cause__, KeyError)


@pytest.mark.parametrize(
    ("target", "error", "message"),
    [
        (PartitionSpec("data"), TypeError, r"is a PartitionSpec.*NamedSharding\(mesh,"),
        ("cpu:0", TypeError, r"target must be None, a jax.Device or a jax.sharding.Sharding, got str"),
    ],
    ids=["partition_spec", "string"],
)
def test_a_bad_target_is_refused_at_construction(target, error, message):
    with pytest.raises(error, match=message):
        dl.device_prefetch(iter([]), target)
    assert not feed_threads()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"cpu_buffer_size": 0}, "cpu_buffer_size must be an integer >= 1, got 0"),
     ({"device_buffer_size": 0}, "device_buffer_size must be an integer >= 1, got 0")],
)
def test_bad_buffer_sizes_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        dl.device_prefetch(iter([]), **kwargs)


# -- shutdown -------------------------------------------------------------------------


def test_close_stops_the_feed_thread():
    before = feed_threads()
    it = dl.device_prefetch(make_loader(n=10_000, epochs=None))
    next(it)
    assert len(feed_threads()) == len(before) + 2  # the read and the transfer threads
    it.close()
    assert wait_until(lambda: feed_threads() == before)
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.multiprocess
def test_close_is_quick_while_the_read_thread_waits_on_a_stuck_worker(tmp_path):
    from tests.integration import workers_pipelines as wp

    loader = dl.DataLoader(
        dl.RangeDataSource(400), dl.SequentialSampler(400),
        [dl.MapTransform(wp.hang_on(13, release=str(tmp_path / "never"))), dl.Batch(4)], worker_count=2,
        warm_start=False,  # record 13 hangs in a worker, not in the read thread
    )
    it = dl.device_prefetch(loader, cpu_buffer_size=1, device_buffer_size=1)
    assert [next(it).tolist() for _ in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    # The read thread waits for unit 3, which never comes (for ten minutes): close()
    # returning at all shows it did not wait for it (else the test's timeout ends it).
    it.close()
    assert wait_until(lambda: not child_pids())
    assert wait_until(lambda: not feed_threads())


def test_close_ends_the_loaders_worker_processes():
    it = dl.device_prefetch(make_loader(n=10_000, epochs=None, workers=2))
    next(it)
    wait_full(it)
    assert child_pids()
    it.close()
    assert wait_until(lambda: not child_pids())
    assert wait_until(lambda: not feed_threads())


def test_garbage_collection_stops_the_thread_and_the_workers():
    it = dl.device_prefetch(make_loader(n=10_000, epochs=None, workers=1))
    next(it)
    del it
    gc.collect()
    assert wait_until(lambda: not feed_threads() and not child_pids())


def test_leaving_a_with_block_early_closes_an_iterator_source():
    class Closable(ListIterator):
        closed = False

        def close(self):
            self.closed = True

    source = Closable([np.zeros(4)] * 100)
    with dl.device_prefetch(source) as it:
        next(it)
    assert source.closed
    assert wait_until(lambda: not feed_threads())


class WaitsUntilClosed(dl.DatasetIterator):
    """A user's iterator whose next() waits until close(); it declares that close() may
    come from another thread (the capability a loader's iterator declares)."""

    closes_from_any_thread = True

    def __init__(self):
        super().__init__()
        self.inside, self.released = threading.Event(), threading.Event()

    def __next__(self):
        self.inside.set()
        self.released.wait()
        raise StopIteration

    def get_state(self):
        return {}

    def set_state(self, state):
        pass

    def close(self):
        self.released.set()
        super().close()


def test_a_source_that_closes_from_any_thread_is_closed_while_its_next_waits(monkeypatch):
    # Were it closed only after its read thread ended, close() would wait out this hour.
    from dataloader.device import feed

    monkeypatch.setattr(feed, "CLOSE_WAIT_S", 3600.0)
    source = WaitsUntilClosed()
    it = dl.device_prefetch(source)
    assert source.inside.wait(60)
    it.close()
    assert source.released.is_set() and source._closed
    assert wait_until(lambda: not feed_threads())


def test_a_source_that_does_not_declare_it_is_closed_after_its_read_thread():
    class Recording(ListIterator):
        reading_at_close = None

        def close(self):
            self.reading_at_close = [t.name for t in feed_threads()]

    source = Recording([np.zeros(4)] * 100)
    it = dl.device_prefetch(source)
    next(it)
    it.close()
    assert source.reading_at_close == []


def test_the_device_iterator_is_a_dataset_iterator_with_its_source_as_parent():
    loader_it = iter(make_loader())
    with dl.device_prefetch(loader_it) as it:
        assert isinstance(it, dl.DatasetIterator)
        assert it._parent is loader_it
        it.start_prefetch()  # the feed reads ahead already: nothing to start, no error
        next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_a_slow_source_keeps_the_consumer_waiting_not_failing(cpus):
    def slow():
        for i in range(3):
            time.sleep(0.2)
            yield np.full((4,), i)

    with dl.device_prefetch(slow(), cpus[0]) as it:
        assert [int(b[0]) for b in it] == [0, 1, 2]


def test_importing_dataloader_does_not_import_jax():
    code = (
        "import sys, dataloader as dl\n"
        "assert 'jax' not in sys.modules, 'import dataloader imported jax'\n"
        "assert callable(dl.device_prefetch) and 'jax' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
