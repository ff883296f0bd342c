"""RayExecutor on a real Ray cluster started here: a head with one CPU and one worker node
(more nodes added and removed by the fault drills). Every test compares every batch with
``worker_count=0``; one cluster serves the whole module."""

from __future__ import annotations

import functools
import gc
import itertools
import os
import time

import numpy as np
import pytest

import dataloader as dl
from dataloader.errors import PipelineError
from tests.dataloader.engine.test_fingerprint_workers import RecordPid, pids
from tests.helpers import wait_until
from tests.integration.conftest import child_pids

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.timeout(180)]

N = 60
STORE = 80 * 2**20  # the smallest object store Ray accepts, times a little


@pytest.fixture(scope="module")
def cluster():
    # Node deaths noticed within about a second (Ray's default is tens of seconds).
    system = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 300,
              "health_check_failure_threshold": 3}
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": STORE, "include_dashboard": False,
        "_system_config": system})
    c.add_node(num_cpus=2, resources={"remote_cpu": 2}, object_store_memory=STORE)
    ray.init(address=c.address, log_to_driver=False)
    pids = [p.process.pid for node in c.list_all_nodes() for ps in node.all_processes.values() for p in ps]
    yield c
    ray.shutdown()
    c.shutdown()
    alive = [pid for pid in pids if _alive(pid)]
    assert not alive, f"Ray processes left running: {alive}"


@pytest.fixture(autouse=True)
def no_leaks():
    """Replaces the folder's check: Ray keeps idle worker processes of its own under the
    cluster's raylets, so what must be gone after a test is our actors' processes."""
    yield
    # Executors dropped by the test kill the actors they kept; collected on every poll, as
    # a thread of the test's stream may hold one a moment longer than the test does.
    assert wait_until(lambda: gc.collect() >= 0 and not _actor_processes()), _actor_processes()


def _actor_processes() -> list[int]:
    found = []
    for pid in child_pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(b"ray::UnitActor"):
                    found.append(pid)
        except OSError:
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Decode(dl.MapTransform):
    def map(self, x):
        return {"x": np.full(5, x, np.int64), "y": np.float32(x) / 2}


class Jitter(dl.RandomMapTransform):
    def random_map(self, e, rng):
        return {**e, "noise": rng.integers(0, 1000, size=3)}


class Explode(dl.FlatMapTransform):
    max_fan_out = 3

    def flat_map(self, e):
        return [e] * (int(e["x"][0]) % 3)


class Odd(dl.FilterTransform):
    def filter(self, e):
        return int(e["x"][0]) % 4 != 1


PIPELINES = {
    "batch": [Decode(), Jitter(), dl.Batch(8)],
    "elements": [Decode(), Jitter()],
    "regroup": [Decode(), Odd(), Explode(), Jitter(), dl.Batch(5, drop_remainder=True)],
}


def loader(ops, **kw):
    return dl.DataLoader(dl.RangeDataSource(N), dl.IndexSampler(N, shuffle=True, seed=7, num_epochs=2),
                         ops, **kw)


def flat(x):
    """A batch or an element as plain lists, for comparing."""
    return {k: np.asarray(v).tolist() for k, v in x.items()}


def run(it, n=None):
    return [flat(x) for x in itertools.islice(it, n)]


def saved(ops, executor, n):
    """The first ``n`` outputs of a stream on ``executor`` and the state after them."""
    it = iter(loader(ops, executor=executor))
    head = run(it, n)
    state = it.get_state()
    it.close()
    return head, state


@pytest.mark.parametrize("layout", sorted(PIPELINES))
def test_same_batches_and_states_as_in_process(cluster, layout):
    ops = PIPELINES[layout]
    local_it = iter(loader(ops))
    ex = dl.RayExecutor(num_workers=2, units_per_worker=2)
    ray_it = iter(loader(ops, executor=ex))
    count = 0
    for want, got in zip(local_it, ray_it, strict=True):
        assert flat(got) == flat(want)
        assert ray_it.get_state() == local_it.get_state()
        count += 1
    assert count > 10
    workers = ray_it.stats()["workers"]
    assert workers and "main" not in workers, workers  # the training process computed no unit
    ray_it.close()


def test_an_actor_killed_mid_epoch_loses_no_unit(cluster):
    ops = PIPELINES["batch"]
    want = run(loader(ops))
    ex = dl.RayExecutor(num_workers=2, units_per_worker=3)
    it = iter(loader(ops, executor=ex))
    got = run(it, 2)
    first = ex.actors()
    ray.kill(first[0])  # it holds units in flight: they go to the other actor / a new one
    got += run(it)
    assert got == want
    assert first[0] not in ex.actors()  # replaced
    it.close()


def test_a_node_removed_mid_epoch_loses_no_unit(cluster):
    ops = PIPELINES["regroup"]
    want = run(loader(ops))
    doomed = cluster.add_node(num_cpus=1, resources={"drill": 1}, object_store_memory=STORE)
    ex = dl.RayExecutor(num_workers=1, resources={"drill": 1}, units_per_worker=3)
    it = iter(loader(ops, executor=ex))
    got = run(it, 2)
    spare = cluster.add_node(num_cpus=1, resources={"drill": 1}, object_store_memory=STORE)
    cluster.remove_node(doomed, allow_graceful=False)  # its raylet is killed
    got += run(it)
    it.close()
    cluster.remove_node(spare)
    assert got == want


def test_actors_added_and_removed_mid_epoch_change_no_batch(cluster):
    ops = PIPELINES["batch"]
    want = run(loader(ops))
    ex = dl.RayExecutor(num_workers=1)
    it = iter(loader(ops, executor=ex))
    got = run(it, 2)
    ex.scale(2)
    got += run(it, 2)
    assert len(ex.actors()) == 2
    ex.scale(1)
    got += run(it)
    assert len(ex.actors()) == 1
    assert got == want
    it.close()


def test_a_closed_stream_lends_its_actors_to_the_next_and_close_ends_them(cluster):
    ex = dl.RayExecutor(num_workers=2)
    it = iter(loader(PIPELINES["batch"], executor=ex))
    next(it)
    handles = ex.actors()
    it.close()
    assert ex.actors() == []
    again = iter(loader(PIPELINES["batch"], executor=ex))
    assert [flat(x) for x in again] == run(loader(PIPELINES["batch"]))
    assert sorted(map(str, ex.actors())) == sorted(map(str, handles))  # no new actor started
    again.close()
    # Another pipeline starts actors of its own, and the idle ones of the first, which
    # may hold the CPUs they need, end (ray.kill is asynchronous: hence the wait).
    other = iter(loader(PIPELINES["elements"], executor=ex))
    assert flat(next(other)) == run(loader(PIPELINES["elements"]), 1)[0]
    assert wait_until(lambda: all(map(_dead, handles)), timeout=60)
    handles = ex.actors()
    other.close()
    ex.close()
    assert wait_until(lambda: all(map(_dead, handles)), timeout=60)


def _dead(handle) -> bool:
    try:
        ray.get(handle.ready.remote(), timeout=30)
    except ray.exceptions.RayActorError:
        return True
    return False


class Boom(dl.MapTransform):
    def map(self, x):
        if x == 13:
            raise ValueError("bad record 13")
        return x


def test_an_error_in_user_code_arrives_at_its_record_named(cluster):
    ops = [Boom()]
    sampler = dl.IndexSampler(N, num_epochs=1)
    it = iter(dl.DataLoader(dl.RangeDataSource(N), sampler, ops, executor=dl.RayExecutor(num_workers=2)))
    assert [int(next(it)) for _ in range(13)] == list(range(13))
    with pytest.raises(PipelineError, match=r"Boom failed on record 13 .*ValueError: bad record 13") as info:
        next(it)
    assert info.value.record_index == 13
    assert "Traceback in worker" in str(info.value)
    assert [int(x) for x in it] == list(range(14, N))  # goes on after the failing record
    it.close()


def test_an_unreachable_cluster_fails_at_construction(cluster):
    with pytest.raises(ConnectionError, match=r"no Ray cluster answers at address '127\.0\.0\.1:9'.*ray start"):
        dl.RayExecutor(address="127.0.0.1:9")
    with pytest.raises(ValueError, match=r"address 'nowhere' is not host:port"):
        dl.RayExecutor(address="nowhere")


@pytest.mark.parametrize(("kw", "match"), [
    ({"num_workers": -1}, r"num_workers must be an integer >= 0, got -1"),
    ({"num_workers": 0}, r"needs at least one actor: num_workers and local_workers are both 0"),
    ({"resources": {"gpu_node": -1}}, r"resources must map .* 'gpu_node': -1"),
    ({"start_timeout_s": 0}, r"start_timeout_s must be a positive number"),
])
def test_bad_settings_are_named(cluster, kw, match):
    with pytest.raises(ValueError, match=match):
        dl.RayExecutor(**kw)


def test_local_workers_and_an_executor_together_are_refused(cluster):
    with pytest.raises(ValueError, match=r"pass worker_count=0 with an executor"):
        loader([], worker_count=2, executor=dl.RayExecutor())


def test_actors_that_cannot_be_placed_fail_with_what_they_asked_for(cluster):
    ex = dl.RayExecutor(num_workers=1, resources={"no_such_node": 1}, start_timeout_s=1)
    with pytest.raises(dl.WorkerError, match=r"no Ray actor became ready .*no_such_node"):
        next(iter(loader(PIPELINES["batch"], executor=ex)))


def test_results_come_back_as_numpy_without_a_copy(cluster):
    # Large enough for the object store (not inlined): a read-only view of it.
    class Big(dl.MapTransform):
        def map(self, x):
            return np.full(40_000, x, np.int64)

    it = iter(loader([Big(), dl.Batch(4)], executor=dl.RayExecutor(num_workers=1)))
    batch = next(it)
    assert batch.shape == (4, 40_000)
    assert not batch.flags.writeable  # Ray's zero-copy view
    it.close()


def test_a_dropped_stream_and_executor_end_their_actors_without_the_garbage_collector(cluster):
    # Reference counting alone frees them (no cycle), so their actors end as soon as the
    # last reference goes, not at the next full collection, which may be minutes away.
    gc.collect()
    gc.disable()
    try:
        it = iter(loader(PIPELINES["batch"], executor=dl.RayExecutor(num_workers=1)))
        next(it)
        assert _actor_processes()
        it.close()  # parks the actor on the executor, which the iterator's loader holds
        del it
        assert wait_until(lambda: not _actor_processes()), _actor_processes()
    finally:
        gc.enable()


def test_a_config_with_a_ray_section_runs_on_actors(cluster):
    from dataloader.config import parse_config

    config = parse_config({
        "source": {"kind": "dataloader.sources.RangeDataSource", "options": {"start": N}},
        "sampler": {"shuffle": True, "seed": 7, "num_epochs": 1},
        "operations": [{"batch": 8}],
        "loader": {"ray": {"num_workers": 2, "units_per_worker": 1, "unit_timeout_s": 60}},
    })
    assert config.loader.ray["unit_timeout_s"] == 60
    loader_ = config.build_loader()
    it = iter(loader_)
    got = [b.tolist() for b in it]
    assert "main" not in it.stats()["workers"]
    it.close()
    want = [b.tolist() for b in parse_config({**config.data, "loader": {}}).build_loader()]
    assert got == want


def test_the_device_feed_reads_a_ray_loader_as_any_other(cluster):
    pytest.importorskip("jax")
    ops = PIPELINES["batch"]
    ex = dl.RayExecutor(num_workers=2)
    feed = dl.device_prefetch(loader(ops, executor=ex).iterator())
    got = [flat(b) for b in itertools.islice(feed, 5)]
    state = feed.get_state()
    feed.close()  # from this thread while the feed's thread may wait on the actors
    got += run(loader(ops).iterator(state))
    assert got == run(loader(ops))


def test_local_and_remote_actors_together_give_the_same_batches(cluster):
    ops = PIPELINES["regroup"]
    ex = dl.RayExecutor(num_workers=1, local_workers=1, resources={"remote_cpu": 1})
    it = iter(loader(ops, executor=ex))
    got = run(it, 3)
    nodes = {ray.get(h.ready.remote())[2] for h in ex.actors()}
    got += run(it)
    it.close()
    ex.close()
    here = ray.get_runtime_context().get_node_id()
    assert here in nodes
    assert len(nodes) == 2  # one actor on this node, one on the node with remote_cpu
    assert got == run(loader(ops))


_INITIALISED: list[tuple[int, int]] = []


def _init(index, count):
    _INITIALISED.append((index, count))


class Marked(dl.MapTransform):
    def map(self, x):
        return (x, _INITIALISED[0][1] if _INITIALISED else -1)


def test_worker_init_fn_runs_once_in_each_actor(cluster):
    ex = dl.RayExecutor(num_workers=2)
    it = iter(dl.DataLoader(dl.RangeDataSource(N), dl.IndexSampler(N, num_epochs=1), [Marked()],
                            worker_init_fn=_init, executor=ex))
    got = list(it)
    it.close()
    assert got == [(i, 2) for i in range(N)]  # every unit computed after init(index, 2)
    assert _INITIALISED == []  # and not in this process


def _broken_init(index, count):
    raise RuntimeError(f"no GPU driver on actor {index}")


def test_a_failing_worker_init_fn_is_named(cluster):
    ex = dl.RayExecutor(num_workers=1)
    it = iter(loader(PIPELINES["batch"], worker_init_fn=_broken_init, executor=ex))
    with pytest.raises(dl.WorkerError, match=r"(?s)3 Ray actors in a row could not start.*no GPU driver"):
        next(it)
    it.close()


class Tokens(dl.MapTransform):
    def map(self, x):
        return {"tokens": np.arange(1 + x % 11, dtype=np.int32) + x}


def test_a_packing_pipeline_and_its_states_match_in_process(cluster):
    """The packer runs in this process on the units' elements, whoever computed them."""
    ops = [Tokens(), dl.FirstFitPack({"tokens": 16}, num_packing_bins=3), dl.Batch(2)]
    want = run(loader(ops))
    ex = dl.RayExecutor(num_workers=2)
    it = loader(ops, executor=ex).iterator()
    got = run(it, 5)
    state = it.get_state()
    it.close()
    got += run(loader(ops).iterator(state))
    assert got == want
    assert len(want) > 10


class Slow(dl.MapTransform):
    def map(self, x):
        if x == 5:
            time.sleep(1.0)  # ten times the warning's threshold below
        return x


def test_an_actor_stuck_on_a_unit_is_logged_naming_it(cluster, caplog):
    ex = dl.RayExecutor(num_workers=1, stall_warning_s=0.1)
    loader_ = dl.DataLoader(dl.RangeDataSource(8), dl.IndexSampler(8, num_epochs=1), [Slow(), dl.Batch(4)],
                            executor=ex)
    with caplog.at_level("WARNING", logger="dataloader"):
        assert [b.tolist() for b in loader_] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    ex.close()
    stalls = [r.getMessage() for r in caplog.records if "has been computing unit" in r.getMessage()]
    # Unit 1 for sure (unit 0 too if a loaded machine makes it slow), each once; the
    # pool's own wording (one loop watches every kind of worker).
    assert any("Ray actor" in m and "unit 1 (positions [4, 8), record indices [4, 5, 6, 7])" in m
               for m in stalls), stalls
    assert len({m.split(" for ")[0].split("computing ")[1] for m in stalls}) == len(stalls), stalls


class HangOnce(dl.MapTransform):
    """Record 5 hangs the first time it is computed (a file marks that it was)."""

    def __init__(self, flag):
        self.flag = flag

    def map(self, x):
        if x == 5 and not os.path.exists(self.flag):
            open(self.flag, "w").close()
            time.sleep(600)  # until unit_timeout_s kills the actor
        return x


def test_an_actor_past_unit_timeout_s_is_killed_and_its_unit_computed_elsewhere(cluster, tmp_path, caplog):
    flag = str(tmp_path / "hung")
    ex = dl.RayExecutor(num_workers=2, unit_timeout_s=2, stall_warning_s=None)
    ops = [HangOnce(flag), dl.Batch(4)]
    loader_ = dl.DataLoader(dl.RangeDataSource(12), dl.IndexSampler(12, num_epochs=1), ops, executor=ex)
    with caplog.at_level("WARNING", logger="dataloader"):
        assert [b.tolist() for b in loader_] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    ex.close()
    assert os.path.exists(flag)  # it did hang once
    killed = [r.getMessage() for r in caplog.records if "killing the actor" in r.getMessage()]
    assert len(killed) == 1, killed


def test_unit_timeout_s_is_checked(cluster):
    with pytest.raises(ValueError, match="unit_timeout_s must be a positive number of seconds or None, got 0"):
        dl.RayExecutor(num_workers=1, unit_timeout_s=0)


class Logged(dl.MapTransform):
    """Appends each record it computes to a file, slowly (the actor is busy a while)."""

    def __init__(self, path):
        self.path = path

    def map(self, x):
        time.sleep(0.1)
        with open(self.path, "a") as f:
            f.write(f"{x}\n")
        return x


def test_closing_a_stream_cancels_the_units_its_actor_had_not_started(cluster, tmp_path):
    """One actor with 4 units in flight; the stream is closed after its first batch and
    the next stream takes the parked actor: of the dropped units only the one it was
    computing runs (without the cancel, all 4 would, before the new stream's first)."""
    log = tmp_path / "computed"
    ex = dl.RayExecutor(num_workers=1, units_per_worker=4)
    loader_ = dl.DataLoader(dl.RangeDataSource(16), dl.IndexSampler(16, num_epochs=1),
                            [Logged(str(log)), dl.Batch(2)], executor=ex)
    it = iter(loader_)
    assert next(it).tolist() == [0, 1]
    it.close()
    assert [b.tolist() for b in loader_] == [[i, i + 1] for i in range(0, 16, 2)]
    ex.close()
    computed = [int(x) for x in log.read_text().split()]
    # stream 1: unit 0 and at most the unit then running (2 and 3); then stream 2 whole
    assert computed[-16:] == list(range(16)), computed
    assert len(computed) <= 2 + 2 + 16, computed


def test_stats_name_the_ray_actors_and_the_advice_says_raise_num_workers(cluster):
    ex = dl.RayExecutor(num_workers=2, local_workers=1)
    it = iter(loader(PIPELINES["batch"], executor=ex))
    run(it, 3)
    stats = it.stats()
    it.close()
    ex.close()
    executor = stats["pipeline"]["executor"]
    assert executor["kind"] == "ray"
    assert (executor["actors"], executor["remote_actors"], executor["local_actors"]) == (3, 2, 1)
    stats["pipeline"]["device_feed"] = {"cpu_buffer_size": 2, "device_buffer_size": 3}
    stats.update(wait_share=0.5, wait_s=3.0)
    starved = next(a for a in dl.advise(stats) if a.rule == "step_starved")
    assert starved.remedy.startswith(
        "raise RayExecutor num_workers (now 2 actors, 1 more on this node (local_workers))")
    assert "worker_count" not in starved.remedy


@pytest.mark.parametrize("layout", ["batch", "regroup"])
def test_a_state_saved_with_ray_restores_checked_on_the_actors_and_with_the_pool_and_back(
    cluster, tmp_path, layout
):
    """A state saved with Ray: its fingerprint check recomputes the saved step on the
    actors (no operation runs in the training process), by iterator(state) and by
    set_state; the stream goes on with the batches of an uninterrupted one, on Ray, then
    from a later state on the local pool, then back on Ray."""
    log = str(tmp_path / "pids")
    ops = [dl.MapTransform(RecordPid(log)), *PIPELINES[layout]]
    want = run(loader(ops))
    ex = dl.RayExecutor(num_workers=2)
    head, state = saved(ops, ex, 5)
    assert "fingerprint" in state
    os.remove(log)
    it = loader(ops, executor=ex).iterator(state)  # the check runs here, before any next()
    ran = pids(log)
    assert ran, "the check recomputed the step somewhere"
    assert os.getpid() not in ran
    assert head + run(it) == want
    it = iter(loader(ops, executor=ex))
    next(it)
    os.remove(log)
    it.set_state(state)
    ran = pids(log)
    assert ran and os.getpid() not in ran
    middle = run(it, 3)
    state = it.get_state()
    it.close()
    pool_it = loader(ops, worker_count=2).iterator(state)
    middle += run(pool_it, 3)
    state = pool_it.get_state()
    pool_it.close()
    tail = run(loader(ops, executor=ex).iterator(state))
    assert head + middle + tail == want
    ex.close()


def scale(e, factor):
    return {**e, "y": e["y"] * factor}


def test_a_restore_with_ray_refuses_a_changed_map(cluster):
    def ops(factor):
        return [Decode(), dl.MapTransform(functools.partial(scale, factor=factor)), Odd(), dl.Batch(4)]

    ex = dl.RayExecutor(num_workers=1)
    state = saved(ops(1), ex, 3)[1]
    with pytest.raises(dl.StateMismatchError, match="the operations' output differs"):
        loader(ops(2), executor=ex).iterator(state)
    want = run(loader(ops(2)), 4)
    it = iter(loader(ops(2), executor=ex))
    first = flat(next(it))
    with pytest.raises(dl.StateMismatchError, match="the operations' output differs"):
        it.set_state(state)
    assert [first, *run(it, 3)] == want  # a refused set_state leaves the iterator where it was
    it.close()
    ex.close()


def test_an_elastic_restore_with_ray_is_checked_on_the_actors(cluster, tmp_path):
    """Every old host's states (two hosts, batches of 4) restored on one host (batches of
    8): the steps are recomputed on actors of their own (no operation in the trainer),
    and the stream is the one the in-process restore gives. (The check's actors, parked
    for a plan of their own, once held the cluster's 3 CPUs: the stream's actors never
    started.)"""
    log = str(tmp_path / "pids")

    def sharded(shard, batch, **kw):
        sampler = dl.IndexSampler(N, dl.ShardOptions(*shard), shuffle=True, seed=3, num_epochs=2)
        return dl.DataLoader(dl.RangeDataSource(N), sampler,
                             [dl.MapTransform(RecordPid(log)), Decode(), dl.Batch(batch)], **kw)

    old = []
    for host in range(2):
        it = iter(sharded((host, 2), 4))
        run(it, 3)
        old.append(it.get_state())
    want = run(sharded((0, 1), 8).iterator(old))
    os.remove(log)
    ex = dl.RayExecutor(num_workers=1)
    it = sharded((0, 1), 8, executor=ex).iterator(old)
    ran = pids(log)
    assert ran and os.getpid() not in ran
    assert run(it) == want
    ex.close()


class SlowRecords(dl.MapTransform):
    """25 ms a record: the units sent as the consumer takes a batch are still running
    when it goes away, and their answers are not in when it comes back."""

    def map(self, x):
        time.sleep(0.025)
        return x


def test_a_consumer_pause_is_not_counted_as_an_actors_compute(cluster, caplog):
    """Issue 33's case: 3 batches, a training step of twice unit_timeout_s, the rest;
    no stall warning, no actor killed or started, the same batches."""
    ex = dl.RayExecutor(num_workers=2, unit_timeout_s=3, stall_warning_s=2)
    ops = [SlowRecords(), *PIPELINES["batch"]]
    it = iter(loader(ops, executor=ex))
    with caplog.at_level("WARNING", logger="dataloader"):
        got = run(it, 3)
        actors = ex.actors()
        time.sleep(6)  # the units in flight finish meanwhile; their answers wait
        got += run(it)
    now = ex.actors()  # none killed, none started: the very handles
    assert len(now) == len(actors) == 2 and all(any(h is g for g in actors) for h in now)
    it.close()
    ex.close()
    assert [r.getMessage() for r in caplog.records if r.name == "dataloader"] == []
    assert got == run(loader(ops))
