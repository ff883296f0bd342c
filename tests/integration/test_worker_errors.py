"""Every failure in a worker arrives at its record, named: exceptions of any type,
unreadable records, results that do not pickle; real crashes stay crashes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import dataloader as dl
from tests.helpers import PATIENCE_S, REPO_ROOT, python_script, two_array_record_files
from tests.integration import workers_pipelines as wp

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

KINDS = {
    "KeyboardInterrupt": (KeyboardInterrupt, r"KeyboardInterrupt: pressed inside a map"),
    "SystemExit(3)": (SystemExit, r"SystemExit: 3"),
    "sys.exit(123)": (SystemExit, r"SystemExit: 123"),
    "custom": (wp.CustomBaseException, r"CustomBaseException: a BaseException of the user's own"),
}


def make(op, n=40, batch=4, **kwargs):
    kwargs.setdefault("worker_count", 2)
    kwargs.setdefault("warm_start", False)  # every unit in a worker: these tests are about workers
    return dl.DataLoader(dl.RangeDataSource(n), dl.SequentialSampler(n), [dl.MapTransform(op), dl.Batch(batch)], **kwargs)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_base_exception_in_a_worker_is_the_error_at_its_record(kind):
    cause_type, text = KINDS[kind]
    it = iter(make(wp.raise_base_on(17, kind)))
    assert [next(it).tolist() for _ in range(4)] == [list(range(i, i + 4)) for i in range(0, 16, 4)]
    with pytest.raises(
        dl.PipelineError,
        match=rf"(?s)MapTransform\(raise_base_on\.<locals>\.fn\) failed on record 17 \(position 17\): {text}"
        rf".*Traceback in worker \d.*in fn\n.*raise",
    ) as info:
        next(it)
    error = info.value
    assert not isinstance(error, dl.WorkerCrashError)
    assert (error.record_index, error.position) == (17, 17)
    assert error.operation == "MapTransform(raise_base_on.<locals>.fn)"
    assert isinstance(error.__cause__, cause_type)
    # The training process goes on: past the record, from a state.
    state = it.get_state()
    state["position"] = 20
    it.set_state(state)
    assert next(it).tolist() == [20, 21, 22, 23]
    it.close()


def test_sys_exit_in_a_worker_does_not_end_the_training_process():
    script = textwrap.dedent(
        """
        import dataloader as dl
        from tests.integration import workers_pipelines as wp
        loader = dl.DataLoader(dl.RangeDataSource(40), dl.SequentialSampler(40),
                               [dl.MapTransform(wp.raise_base_on(0, "sys.exit(123)")), dl.Batch(4)],
                               worker_count=2)
        try:
            next(iter(loader))
        except dl.PipelineError as error:
            print("caught", error.record_index, type(error.__cause__).__name__)
        print("still running")
        """
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["caught 0 SystemExit", "still running"]


def test_a_real_ctrl_c_still_interrupts_a_loader_without_workers():
    with python_script(
        """
        import dataloader as dl
        from tests.integration import workers_pipelines as wp
        loader = dl.DataLoader(dl.RangeDataSource(10**6), dl.SequentialSampler(10**6),
                               [dl.MapTransform(wp.slow_identity), dl.Batch(16)], worker_count=0)
        it = iter(loader)
        next(it)
        print("running", flush=True)
        for batch in it:
            pass
        """
    ) as proc:
        assert proc.stdout.readline().strip() == "running"
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        _, err = proc.communicate(timeout=PATIENCE_S)
        assert proc.returncode != 0
        assert err.rstrip().endswith("KeyboardInterrupt"), err  # not wrapped in a PipelineError
        assert "PipelineError" not in err


@pytest.mark.parametrize(("op", "how"), [(wp.exit_on(23, 7), r"exit code 7"), (wp.kill_self_on(23), r"signal 9")])
def test_a_real_crash_stays_a_worker_crash_after_its_retries(op, how):
    it = iter(make(op, n=60, batch=5, warm_start=False))
    assert [next(it).tolist() for _ in range(4)][-1] == [15, 16, 17, 18, 19]
    with pytest.raises(dl.WorkerCrashError, match=rf"positions \[20, 25\) killed its worker 3 times \(last: {how}\)"):
        next(it)
    it.close()


def _value(element):
    return element["x"] if isinstance(element, dict) else element[0]


@pytest.mark.parametrize(("op", "record", "where", "type_name"), [
    (lambda x: {"x": x, "f": (lambda: x) if x == 9 else None}, 9, r"\['f'\]", "function"),
    (lambda x: {"x": x, "g": (i for i in range(x))}, 0, r"\['g'\]", "generator"),
    (lambda x: [x, open(os.devnull)] if x == 5 else [x, None], 5, r"\[1\]", "TextIOWrapper"),  # noqa: SIM115 (the open file is the point)
])
def test_an_unpicklable_result_names_record_operation_and_type(op, record, where, type_name):
    # Units of 4 records: the error comes with the unit that holds the record.
    loader = dl.DataLoader(
        dl.RangeDataSource(20), dl.SequentialSampler(20), [dl.MapTransform(op)],
        worker_count=2, warm_start=False, read_options=dl.ReadOptions(unit_size=4),
    )
    it = iter(loader)
    before = record // 4 * 4
    assert [_value(next(it)) for _ in range(before)] == list(range(before))
    with pytest.raises(
        dl.PipelineError,
        match=rf"the element of record {record} \(position {record}\) after MapTransform\(<lambda>\) cannot be "
        rf"sent to the training process: it holds a {type_name} at {where}, which does not pickle .*"
        r"Results cross processes only when worker_count > 0",
    ) as info:
        next(it)
    assert info.value.record_index == record and info.value.operation == "MapTransform(<lambda>)"
    it.close()


def test_an_unpicklable_batch_names_the_element_that_holds_the_part():
    loader = dl.DataLoader(
        dl.RangeDataSource(20), dl.SequentialSampler(20),
        [dl.MapTransform(lambda x: {"f": lambda: x}), dl.Batch(4, batch_fn=list)], worker_count=2, warm_start=False,
    )
    with pytest.raises(dl.PipelineError, match=r"the batch of positions \[0, 4\) after Batch\(4, .*batch_fn=list\): its "
                       r"element of record 0 \(position 0\) after MapTransform\(.*<lambda>\) .* holds a function at \['f'\]"):
        next(iter(loader))


def test_an_unpicklable_batch_names_the_record_behind_it_not_the_first_of_the_batch():
    """Record 57 makes the part; it is the 3rd element of its batch of 8, wherever the
    shuffle put it."""
    n = 80
    sampler = dl.IndexSampler(n, shuffle=True, seed=4, num_epochs=1)
    loader = dl.DataLoader(
        dl.RangeDataSource(n), sampler,
        [dl.MapTransform(lambda x: {"x": x, "f": (lambda: x) if x == 57 else None}), dl.Batch(8, batch_fn=list)],
        worker_count=2, warm_start=False,
    )
    position = int(np.flatnonzero(sampler.record_keys(np.arange(n)) == 57)[0])
    start = position // 8 * 8
    it = iter(loader)
    assert len([next(it) for _ in range(start // 8)]) == start // 8
    with pytest.raises(
        dl.PipelineError,
        match=rf"the batch of positions \[{start}, {start + 8}\) after Batch\(8, .*\): its element of record 57 "
        rf"\(position {position}\) after MapTransform\(.*<lambda>\) cannot be sent .* holds a function at \['f'\]",
    ) as info:
        next(it)
    assert (info.value.record_index, info.value.position) == (57, position)
    assert info.value.operation.startswith("MapTransform(") and info.value.operation.endswith("<lambda>)")
    it.close()


def test_a_batch_fn_that_makes_an_unpicklable_batch_names_the_batch():
    loader = dl.DataLoader(
        dl.RangeDataSource(20), dl.SequentialSampler(20),
        [dl.MapTransform(lambda x: x), dl.Batch(4, batch_fn=lambda xs: {"xs": xs, "lock": threading.Lock()})],
        worker_count=2, warm_start=False,
    )
    with pytest.raises(dl.PipelineError, match=r"the batch of positions \[0, 4\) \(first record 0\) after Batch\(4, "
                       r".*\) cannot be sent .* holds a lock at \['lock'\]"):
        next(iter(loader))


def test_a_corrupt_record_read_in_a_worker_is_named_exactly(tmp_path):
    source = dl.ArrayRecordDataSource(two_array_record_files(tmp_path, corrupt=12))
    loader = dl.DataLoader(source, dl.SequentialSampler(40), [dl.Batch(10)], worker_count=2, warm_start=False)
    it = iter(loader)
    assert [len(next(it)) for _ in range(3)] == [10, 10, 10]
    with pytest.raises(
        dl.PipelineError,
        match=r"(?s)reading record 32 \(position 32\) in file '.*b\.array_record' \(record 12 of its 20\) from "
        r"ArrayRecordDataSource.* failed: RuntimeError: .*chunk data hash mismatch.*Traceback in worker",
    ) as info:
        next(it)
    assert (info.value.record_index, info.value.operation) == (32, "read")
    it.close()


def test_blocks_that_cannot_grow_fall_back_to_pipes_with_one_warning(monkeypatch):
    """Results outgrow the blocks, and memory cannot hold bigger ones: pipes, warned once."""
    real = os.posix_fallocate

    def small_memory(fd, offset, length):  # in the parent, which makes the blocks: 1 MiB "fits"
        if length > 2**20:
            raise OSError(28, "No space left on device")
        real(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", small_memory)
    loader = make(wp.grow_at(24, 2 * 2**20), n=64, batch=4)
    with pytest.warns(RuntimeWarning) as caught:
        got = list(loader)
    assert [b["id"].tolist() for b in got] == [list(range(i, i + 4)) for i in range(0, 64, 4)]
    assert [int(b["x"][0, 0]) for b in got] == list(range(0, 64, 4))
    assert got[-1]["x"].shape == (4, 2 * 2**20)
    falls = [str(w.message) for w in caught if "results travel through pipes" in str(w.message)]
    assert len(falls) == 1, falls
    assert re.search(r"a result block of [\d.]+ MiB could not be made \(\[Errno 28\] No space left on device", falls[0])
    assert "give the job more memory" in falls[0]


def test_results_keep_their_values_after_a_pipe_fallback():
    loader = make(lambda x: np.full(3, x), n=8, batch=4)
    assert [b.tolist() for b in loader] == [[[i] * 3 for i in range(j, j + 4)] for j in (0, 4)]


# -- with the defaults: no user code in the training process ---------------------------------

_FIRST_UNIT_CRASH = """
    import ctypes, os, dataloader as dl

    def crash(x):
        if x == 0:  # the very first record: computed before any worker could be ready
            {crash}
        return x

    loader = dl.DataLoader(dl.RangeDataSource(40), dl.SequentialSampler(40),
                           [dl.MapTransform(crash), dl.Batch(4)], worker_count=2)
    try:
        next(iter(loader))
    except dl.WorkerCrashError as exc:
        print("survived:", exc, flush=True)
    """


@pytest.mark.parametrize("attempt", range(3))  # timing once decided where this ran
@pytest.mark.parametrize(("crash", "how"), [("os._exit(3)", "exit code 3"), ("ctypes.string_at(0)", "signal 11")])
def test_with_defaults_a_record_that_crashes_its_process_in_the_first_unit_never_ends_the_trainer(
    crash, how, attempt
):
    with python_script(_FIRST_UNIT_CRASH.format(crash=crash)) as proc:
        out, err = proc.communicate(timeout=PATIENCE_S)
    assert proc.returncode == 0, err
    assert re.search(rf"survived: the unit of positions \[0, 4\) killed its worker 3 times \(last: {how}\)", out), out


@pytest.mark.parametrize("attempt", range(3))
def test_with_defaults_worker_init_fn_applies_to_every_unit(attempt):
    def mark(index, count):
        os.environ["GRANARY_TEST_INIT"] = f"{index}/{count}"

    def seen(x):
        return {"x": x, "init": os.environ.get("GRANARY_TEST_INIT", "none"), "pid": os.getpid()}

    loader = dl.DataLoader(dl.RangeDataSource(24), dl.SequentialSampler(24),
                           [dl.MapTransform(seen), dl.Batch(4, batch_fn=list)], worker_count=2,
                           worker_init_fn=mark)
    elements = [e for batch in loader for e in batch]
    assert [e["x"] for e in elements] == list(range(24))
    assert {e["init"] for e in elements} <= {"0/2", "1/2"}
    assert os.getpid() not in {e["pid"] for e in elements}


@pytest.mark.parametrize("attempt", range(3))
def test_with_defaults_an_unpicklable_result_in_the_first_unit_is_named(attempt):
    loader = dl.DataLoader(
        dl.RangeDataSource(20), dl.SequentialSampler(20),
        [dl.MapTransform(lambda x: {"x": x, "lock": threading.Lock() if x == 0 else None}), dl.Batch(4, batch_fn=list)],
        worker_count=2,
    )
    with pytest.raises(dl.PipelineError, match=r"its element of record 0 \(position 0\) .* holds a lock at \['lock'\], which does not pickle"):
        next(iter(loader))


@pytest.mark.parametrize("attempt", range(3))
def test_with_defaults_a_keyboard_interrupt_in_the_first_unit_is_the_error_at_its_record(attempt):
    it = iter(dl.DataLoader(dl.RangeDataSource(40), dl.SequentialSampler(40),
                            [dl.MapTransform(wp.raise_base_on(0, "KeyboardInterrupt")), dl.Batch(4)], worker_count=2))
    with pytest.raises(dl.PipelineError, match=r"failed on record 0 \(position 0\): KeyboardInterrupt"):
        next(it)
    it.close()


class FailsAt:
    """A source of ``n`` records whose record ``bad`` cannot be read (picklable)."""

    def __init__(self, n: int, bad: int) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == self.bad:
            raise OSError(f"record {i} is damaged")
        return i


def _fails_on_nine(x):
    if x == 9:
        raise ValueError("nine")
    return x


@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("failing", ["map", "read"])
@pytest.mark.parametrize("unit_size", [None, 4, 128])
def test_the_records_before_a_failing_one_are_handed_out_whatever_the_units(workers, failing, unit_size):
    # Units are cut by what elements cost (or by unit_size): the error comes at record 9
    # after exactly records 0..8 however the stream was cut, and the state points at it.
    if failing == "map":
        ds = dl.MapDataset.range(300).map(_fails_on_nine)
    else:
        ds = dl.MapDataset.source(FailsAt(300, 9)).map(lambda x: x)
    it_ds = ds.to_iter_dataset(dl.ReadOptions(unit_size=unit_size) if unit_size else None)
    if workers:
        it_ds = it_ds.mp_prefetch(dl.MultiprocessingOptions(num_workers=workers))
    it = iter(it_ds)
    out = [next(it) for _ in range(9)]
    with pytest.raises(dl.PipelineError) as caught:
        next(it)
    assert out == list(range(9))
    assert (caught.value.position, caught.value.record_index) == (9, 9)
    assert it.get_state()["position"] == 9
    it.close()


def _fails_on_nine_and_twenty(x):
    if x in (9, 20):
        raise ValueError(f"bad {x}")
    return x


@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("unit_size", [None, 4, 128])
def test_an_element_stream_goes_on_after_the_failing_record(workers, unit_size):
    # Catching PipelineError and going on skips exactly the failing records, whatever
    # the worker count and however the stream was cut into units.
    ds = dl.MapDataset.range(60).map(_fails_on_nine_and_twenty).to_iter_dataset(
        dl.ReadOptions(unit_size=unit_size) if unit_size else None)
    if workers:
        ds = ds.mp_prefetch(dl.MultiprocessingOptions(num_workers=workers))
    it = iter(ds)
    out, failed = [], []
    while True:
        try:
            out.append(next(it))
        except StopIteration:
            break
        except dl.PipelineError as exc:
            failed.append(exc.record_index)
    it.close()
    assert failed == [9, 20]
    assert out == [x for x in range(60) if x not in (9, 20)]
