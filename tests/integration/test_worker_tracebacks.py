"""A worker's traceback names the user's file and line, and shows the line.

cloudpickle sends the functions of a script's ``__main__`` by value and writes
``<dynamic-code>`` as their file; the plan sent to workers keeps the real one.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(180)]

# Each way a user writes the failing step: a function of the script, a method of a class
# of the script, a lambda inside a function of the script, and a function of a module
# beside it (which the workers import). The line that raises holds "raise" or "1 // 0".
SCRIPT = '''\
import sys

import dataloader as dl
from user_ops import triple


def double(x):
    if x == 7:
        raise ValueError(f"bad record {x}")
    return 2 * x


class Halve(dl.MapTransform):
    def map(self, x):
        if x == 7:
            raise ValueError(f"bad record {x}")
        return x // 2


def make_divider():
    return lambda x: x // (x - 7)


OPS = {"function": dl.MapTransform(double), "method": Halve(),
       "lambda": dl.MapTransform(make_divider()), "module": dl.MapTransform(triple)}
loader = dl.DataLoader(
    data_source=dl.RangeDataSource(20),
    sampler=dl.IndexSampler(20, num_epochs=1),
    operations=[OPS[sys.argv[1]], dl.Batch(4)],
    worker_count=2,
    warm_start=False,  # every unit in a worker
)
try:
    for batch in loader:
        pass
except dl.PipelineError as error:
    print(error)
'''
MODULE = '''\
def triple(x):
    if x == 7:
        raise ValueError(f"bad record {x}")
    return 3 * x
'''
# (file, line, function, source line) of the frame that raised, for each way
RAISED = {
    "function": ("train.py", 9, "double", 'raise ValueError(f"bad record {x}")'),
    "method": ("train.py", 16, "map", 'raise ValueError(f"bad record {x}")'),
    "lambda": ("train.py", 21, "<lambda>", "return lambda x: x // (x - 7)"),
    "module": ("user_ops.py", 3, "triple", 'raise ValueError(f"bad record {x}")'),
}


@pytest.mark.parametrize("way", sorted(RAISED))
def test_the_error_names_the_users_file_and_line_and_shows_the_line(tmp_path, way):
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "user_ops.py").write_text(MODULE)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "train.py", way], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=170)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "failed on record 7 (position 7)" in text and "Traceback in worker" in text, text
    name, line, function, source = RAISED[way]
    path = tmp_path / name
    assert f'File "{path}", line {line}, in {function}\n    {source}\n' in text, text
    assert "<dynamic-code>" not in text
