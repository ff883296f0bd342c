"""``python -m dataloader run``: the counts, the live progress, advice and ``--report``."""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re
import subprocess
import sys
import time

import pytest
import yaml
from absl import app

import dataloader as dl
from dataloader.cli import main as cli
from dataloader.cli import run as run_cli
from dataloader.cli.report import check_report_dir
from dataloader.engine.stats.progress import Progress
from tests.helpers import REPO_ROOT


def square(x):
    return x * x


def keep_even(x):
    return x % 2 == 0


def slow_row(x):
    time.sleep(0.003)
    return {"x": [float(x)] * 4}


def write_config(tmp_path, operations, loader=None, device=None, start=40) -> str:
    data = {
        "source": {"kind": "dataloader.sources.RangeDataSource", "options": {"start": start}},
        "sampler": {"num_epochs": 1},
        "operations": operations,
        "loader": loader or {},
        "device": device or {"enabled": False},
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture
def config_path(tmp_path) -> str:
    return write_config(tmp_path, [{"map": f"{__name__}.square"}, {"filter": f"{__name__}.keep_even"},
                                   {"batch": {"batch_size": 5}}])


def test_run_counts_records_read_elements_and_batches_out_apart(config_path):
    text = run_cli.run_command([config_path])
    assert re.search(r"records read   40 \([\d,]+/s\)", text), text
    assert re.search(r"elements out   20 \([\d,]+/s\)", text), text
    assert re.search(r"batches out    4 \([\d,.]+/s\)", text), text
    for label in ("first batch", "waiting", "workers        0: main: busy", "read",
                  "MapTransform(square)", "FilterTransform(keep_even)", "batch", "advice:"):
        assert label in text, f"{label!r} missing from:\n{text}"


def test_run_applies_overrides_and_max_batches(config_path):
    # Units of a fixed size: with a filter before the batch, units are otherwise sized by
    # the time they take, so how far the loader read past the third batch would depend
    # on the machine's speed (units of 4 records hold 2 even squares: 3 units, 6 elements).
    text = run_cli.run_command([config_path, "operations.2.batch.batch_size=2", "loader.read_options.unit_size=4"],
                               max_batches=3)
    assert "batches out    3 " in text and "elements out   6 " in text and "records read   12 " in text, text


@pytest.mark.parametrize(
    "operations",
    [[dl.FilterTransform(keep_even)], [dl.FlatMapTransform(lambda x: [x, x])],
     [dl.Batch(5), dl.FilterTransform(lambda b: b[0] > 10)]],
    ids=["filter_without_batch", "flat_map_without_batch", "filter_after_batch"],
)
def test_progress_total_is_unknown_when_a_filter_or_flat_map_changes_the_count(operations):
    loader = dl.DataLoader(dl.RangeDataSource(40), dl.IndexSampler(40, num_epochs=1), operations)
    assert run_cli._expected_batches(loader, None) is None
    assert run_cli._expected_batches(loader, 3) == 3


def test_progress_total_counts_batches_when_nothing_filters():
    def loader(ops):
        return dl.DataLoader(dl.RangeDataSource(40), dl.IndexSampler(40, num_epochs=1), ops)

    assert run_cli._expected_batches(loader([dl.MapTransform(square), dl.Batch(6)]), None) == 7
    assert run_cli._expected_batches(loader([dl.Batch(6, drop_remainder=True)]), None) == 6
    assert run_cli._expected_batches(loader([dl.MapTransform(square)]), None) == 40


def test_default_limit_of_an_endless_stream_is_one_epoch_of_this_shard():
    sampler = dl.IndexSampler(40, dl.ShardOptions(2, 3, drop_remainder=True), num_epochs=None)
    loader = dl.DataLoader(dl.RangeDataSource(40), sampler, [dl.Batch(2)])
    assert run_cli._default_limit(loader) == (6, "one epoch's worth (the stream repeats for ever)")


def test_run_needs_a_config():
    with pytest.raises(app.UsageError, match="run needs a config"):
        run_cli.run_command([])


def test_unknown_command_is_a_usage_error():
    with pytest.raises(app.UsageError, match="expected a command, one of run, inspect, convert, demo"):
        cli.main(["prog", "train"])


def test_progress_line_ends_with_the_live_detail():
    stream = io.StringIO()
    with Progress("run", total=2, unit="batches", stream=stream, detail=lambda: "9 records/s, slowest read 80%") as bar:
        bar.update(2)
    assert stream.getvalue().endswith("] 2/2 batches | 9 records/s, slowest read 80%\n")


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_on_a_terminal_blanks_what_a_longer_line_left():
    stream, details = Terminal(), iter(["a long detail text", "short"])
    bar = Progress("run", stream=stream, detail=lambda: next(details))
    bar._draw(final=False)
    first = stream.getvalue()
    bar._draw(final=True)
    second = stream.getvalue()[len(first):]
    assert first.startswith("\r") and first.endswith("| a long detail text")
    assert second.startswith("\r") and second.rstrip().endswith("| short") and second.endswith(" \n")
    assert len(second) == len(first) + 1  # as wide as the longer line, padded with spaces


def test_the_detail_shows_records_per_second_and_the_slowest_stage(tmp_path):
    path = write_config(tmp_path, [{"map": f"{__name__}.slow_row"}, {"batch": {"batch_size": 4}}])
    it = dl.load_config(path).build_iterator()
    list(it)
    text = run_cli._Detail(it)()
    assert re.fullmatch(r"[\d,]+ records/s, [\d,.]+ batches/s, waiting \d+%, slowest MapTransform\(slow_row\) \d+%", text), text


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_python_m_dataloader_run_draws_progress_and_refuses_a_bad_key(config_path):
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    ok = subprocess.run([sys.executable, "-m", "dataloader", "run", config_path, "loader.worker_count=2",
                         "loader.read_options.unit_size=5"],  # fixed units: see test_run_applies_overrides...
                        capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert re.search(r"pipeline\.yaml 4 batches \| [\d,]+ records/s, .*, slowest ", ok.stderr), ok.stderr
    assert "elements out   20" in ok.stdout
    # Which of the two workers picks up units is up to the scheduler; together with the
    # parent they computed every unit of the 40 records (5 records per unit).
    line = re.search(r"^workers        2: (.*)$", ok.stdout, re.M)
    assert line, ok.stdout
    entries = re.findall(r"(\d+|main): busy \d+% \(([\d,]+) units\)", line.group(1))
    assert entries and {key for key, _ in entries} <= {"0", "1", "main"}, line.group(0)
    assert sum(int(units) for _, units in entries) == 8, line.group(0)
    bad = subprocess.run([sys.executable, "-m", "dataloader", "run", config_path, "sampler.seed=abc"],
                         capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip() == "config error: sampler.seed: expected an integer (or null), got 'abc'"


def images(page: str) -> list[bytes]:
    return [base64.b64decode(data) for data in re.findall(r'<img alt="[^"]+" src="data:image/png;base64,([^"]+)">', page)]


def assert_self_contained(page: str) -> None:
    """Nothing the page would fetch: no script, no stylesheet link, no URL but data: ones."""
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert not re.search(r"""(src|href)=(?!["']?data:)""", page)
    assert "http://" not in page and "https://" not in page


def test_report_writes_a_self_contained_page_and_stats_json(tmp_path):
    path = write_config(tmp_path, [{"map": f"{__name__}.square"}, {"batch": {"batch_size": 8}}], start=400)
    out = tmp_path / "report"
    text = run_cli.run_command([path], report_dir=str(out))
    assert f"report         {out}/stats.json  {out}/report.html" in text
    page = (out / "report.html").read_text()
    assert_self_contained(page)
    pngs = images(page)
    assert len(pngs) == 4  # throughput, stages, timeline, queues (no device feed)
    assert all(png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000 for png in pngs)
    for section in ("Where the time went", "Advice", "Workers", "What the numbers mean", "records read",
                    "elements out", "batches out", "busy share"):
        assert section in page, section
    data = json.loads((out / "stats.json").read_text())
    assert data["stats"]["records_read"] == 400 and data["stats"]["batches_out"] == 50
    assert len(data["units"]) == 50 and {u["worker"] for u in data["units"]} == {"main"}
    assert data["samples"][-1]["batches_out"] == 50
    # Which advice a run gets depends on the machine (beside other jobs this process gets
    # less CPU than wall time, which looks like waiting on I/O): the page and the file say
    # what the rules make of the stats they hold, whatever that is.
    assert data["advice"] == [a._asdict() for a in dl.advise(data["stats"])]
    for advice in data["advice"]:
        assert html.escape(advice["cause"]) in page
    assert not [p for p in os.listdir(out) if p.endswith(".tmp")]


def test_report_with_the_device_feed_plots_the_steps_waiting_and_advises_with_a_step(tmp_path):
    path = write_config(tmp_path, [{"map": f"{__name__}.slow_row"}, {"batch": {"batch_size": 4}}],
                        device={"enabled": True})
    out = tmp_path / "report"
    text = run_cli.run_command([path], report_dir=str(out), step_ms=0.1)
    page = (out / "report.html").read_text()
    assert len(images(page)) == 5 and "waiting share" in page
    assert "the training step waited for data" in page  # the advice, on the page too
    assert "a step of 0.1 ms after each batch" in text and "raise worker_count (now 0)" in text
    data = json.loads((out / "stats.json").read_text())
    assert len(data["device_depths"]) == 11 and "step_starved" in [a["rule"] for a in data["advice"]]
    # Without a step the loop only waits: no advice about the step then.
    plain = run_cli.run_command([path])
    assert "(no step: see --step_ms)" in plain and "step waited for data" not in plain


def test_report_needs_matplotlib_and_a_directory(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    with pytest.raises(app.UsageError, match=r"--report='.*file' is a file; give a directory"):
        check_report_dir(str(tmp_path / "file"))
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(app.UsageError, match=r"pip install 'granary\[report\]'"):
        check_report_dir(str(tmp_path / "out"))
