"""The metadata index is read once, by the training process; workers read records only.

Every process of the child script (the trainer, its fork server, the workers) starts with
an instrumented ``open``: a ``sitecustomize`` module on ``PYTHONPATH`` logs each ``open()``
(what a scan of a file's metadata, or a read of the index, uses) and each ``io.FileIO``
(what a read of records through the cache of open files uses) of a file under the data
folder, with the process id. The log then says who read what.
"""

from __future__ import annotations

import collections
import os

import pytest

from tests.helpers import python_script

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

SITECUSTOMIZE = """
import builtins, io, os

_watch, _log = os.environ["GRANARY_TEST_WATCH"], os.environ["GRANARY_TEST_OPEN_LOG"]


def _note(how, file):
    if isinstance(file, str) and file.startswith(_watch):
        fd = os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, f"{os.getpid()} {how} {file}\\n".encode())
        os.close(fd)


_open, _FileIO = builtins.open, io.FileIO


def _logged_open(file, *args, **kwargs):
    _note("open", file)
    return _open(file, *args, **kwargs)


class _LoggedFileIO(_FileIO):
    def __init__(self, file, *args, **kwargs):
        _note("fileio", file)
        super().__init__(file, *args, **kwargs)


builtins.open, io.FileIO = _logged_open, _LoggedFileIO
"""

SCRIPT = """
import os, sys
import dataloader as dl
from dataloader.cli.index import build_index

folder = {folder!r}
jsonl = [os.path.join(folder, f"j{{i}}.jsonl") for i in range(3)]
for i, path in enumerate(jsonl):
    with open(path, "w") as out:
        out.writelines(f'{{{{"i": {{i * 100 + r}}}}}}\\n' for r in range(40))
tfrecord = [os.path.join(folder, f"t{{i}}.tfrecord") for i in range(3)]
for i, path in enumerate(tfrecord):
    dl.write_tfrecord(path, [b"%d" % (i * 100 + r) for r in range(40)])
print(build_index(jsonl + tfrecord), file=sys.stderr)
with open(os.environ["GRANARY_TEST_OPEN_LOG"], "a") as log:
    log.write(f"{{os.getpid()}} built -\\n")

workers = dl.MultiprocessingOptions(num_workers=2)
rows = dl.MapDataset.source(dl.JsonlDataSource(jsonl)).map(lambda row: row["i"]).batch(8)
got = sorted(x for batch in rows.to_iter_dataset().mp_prefetch(workers) for x in batch.tolist())
assert got == sorted(i * 100 + r for i in range(3) for r in range(40)), got
stream = dl.experimental.TFRecordIterDataset(tfrecord).map(int).batch(8).mp_prefetch(workers)
got = sorted(x for batch in stream for x in batch.tolist())
assert got == sorted(i * 100 + r for i in range(3) for r in range(40)), got
print(os.getpid())
"""


def test_workers_never_read_metadata_and_the_trainer_reads_the_index_once(tmp_path):
    pytest.importorskip("google_crc32c")
    hooks, data, log = tmp_path / "hooks", tmp_path / "data", tmp_path / "opens.log"
    hooks.mkdir()
    data.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")]),
           "GRANARY_TEST_WATCH": str(data), "GRANARY_TEST_OPEN_LOG": str(log)}
    with python_script(SCRIPT.format(folder=str(data)), env=env) as proc:
        out, err = proc.communicate(timeout=200)
    assert proc.returncode == 0, err[-3000:]
    trainer = int(out.split()[-1])
    lines = [line.split(" ", 2) for line in log.read_text().splitlines()]
    built = next(i for i, (_, how, _) in enumerate(lines) if how == "built")
    assert any(how == "open" for _, how, _ in lines[:built])  # the index was built by scanning
    after = collections.Counter((int(pid) == trainer, how, os.path.basename(path))
                                for pid, how, path in lines[built + 1:])
    index = "_granary_index.json"
    # The trainer: the index once (parsed once per process while it is unchanged, though two
    # sources read it: JSONL and the TFRecord stream), no scan of a JSONL file; a TFRecord
    # file is opened once, to check its first record.
    assert after[True, "open", index] == 1, after
    assert not any(after[True, "open", f"j{i}.jsonl"] for i in range(3)), after
    assert all(after[True, "open", f"t{i}.tfrecord"] == 1 for i in range(3)), after
    # The workers: records only (through the cache of open files), neither index nor scan.
    assert not [key for key in after if not key[0] and key[1] == "open"], after
    assert sum(n for (mine, how, _), n in after.items() if not mine and how == "fileio") >= 6, after
