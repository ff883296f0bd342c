"""``run --report=DIR``: ``DIR/stats.json`` and ``DIR/report.html``, one page for people.

The page is self-contained: its plots are PNGs embedded as ``data:`` URIs, its style is
inline, it has no script and loads nothing from the network, so it can be mailed,
attached to an issue or opened on a machine without network. It shows the counts, the
advice, throughput over time, time per stage, a timeline of units per worker, queue
depths, the step's waiting share (with the device feed), each worker's busy share, what
each number means, and the final ``stats()``. ``stats.json`` holds the same data (the
final ``stats()``, the advice, the samples, the units and the device feed's queue
samples), so a report can be redrawn or compared later.

matplotlib is an optional extra (``pip install 'granary[report]'``), imported only here.
"""

from __future__ import annotations

import base64
import html
import json
import os
from typing import Any

from absl import app

from dataloader.cli import plots
from dataloader.cli.record import Recorder
from dataloader.engine.stats import Advice
from dataloader.engine.stats.text import computed_by

GLOSSARY = [
    ("records read", "records read from the data source (a shuffled position each); "
     "for a stream, the rows read from its files"),
    ("elements out", "elements the operations made: after maps, filters, flat maps and "
     "packers, before the batch (the rows of the batches)"),
    ("batches out", "batches handed to the consumer (0 when the pipeline does not batch)"),
    ("waiting", "seconds the consumer spent inside next() (the training step, when the "
     "device feed is on), and their share of the time since its first next()"),
    ("stage seconds", "seconds spent on each stage, in whichever process did the work: "
     "read, each operation by name, batch, transport (receiving results from workers), "
     "iterator-level stages, host_to_device (the device feed's transfers); with workers "
     "they add up over processes, so they can exceed the run's time"),
    ("busy share", "the share of a worker's time spent computing units since its first "
     "unit (\"main\" is this process: the first unit, or every unit without workers)"),
    ("window", "the same numbers over the last seconds (stats()[\"window\"])"),
]

STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 960px; color: #222; }
h1 { margin-bottom: 0; } .sub { color: #666; margin-top: .2em; }
table { border-collapse: collapse; margin: .5em 0 1em; }
td, th { padding: .2em .9em .2em 0; text-align: left; } td.n { text-align: right; }
.advice li { margin: .4em 0; } .none { color: #666; }
figure { margin: 1.2em 0; } img { max-width: 100%; border: 1px solid #ddd; }
figcaption { color: #555; font-size: 90%; } dt { font-weight: 600; } pre { font-size: 12px; }
"""


def check_report_dir(directory: str) -> None:
    """Makes ``directory``, and checks matplotlib is there before the run starts.

    Raises:
        app.UsageError: matplotlib is not installed, or ``directory`` is a file.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise app.UsageError(
            "run --report draws its plots with matplotlib, which is not installed; "
            "pip install 'granary[report]' (or matplotlib)"
        ) from exc
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise app.UsageError(f"--report={directory!r} is a file; give a directory")
    os.makedirs(directory, exist_ok=True)


def _img(png: bytes, alt: str, caption: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _counts(stats: dict[str, Any], first_batch_s: float | None) -> str:
    device = "device_feed" in stats["pipeline"]
    rows = [
        ("records read", f"{stats['records_read']:,}", f"{stats['records_per_s']:,.0f}/s"),
        ("elements out", f"{stats['elements_out']:,}", f"{stats['elements_per_s']:,.0f}/s"),
        ("batches out", f"{stats['batches_out']:,}", f"{stats['batches_per_s']:,.1f}/s"),
        ("first batch", f"{first_batch_s:.3f} s" if first_batch_s is not None else "none", ""),
        ("the training step waited" if device else "the consumer waited",
         f"{stats['wait_s']:.2f} s", f"{stats['wait_share']:.0%} of the time"),
        computed_by(stats["pipeline"]),
        ("run time", f"{stats['active_s']:.2f} s", "since the first next()"),
    ]
    cells = "".join(f"<tr><th>{a}</th><td class=n>{b}</td><td>{c}</td></tr>" for a, b, c in rows)
    return f"<table>{cells}</table>"


def _workers(stats: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(key)}</td><td class=n>{w['busy_share']:.0%}</td>"
        f"<td class=n>{w['units']:,}</td><td class=n>{w['busy_s']:.3f} s</td>"
        f"<td class=n>{w['cpu_s']:.3f} s</td></tr>"
        for key, w in sorted(stats["workers"].items())
    )
    return ("<table><tr><th>worker</th><th>busy share</th><th>units</th><th>computing</th>"
            f"<th>CPU</th></tr>{rows}</table>")


def render(
    stats: dict[str, Any], recorder: Recorder, advice: list[Advice], title: str, first_batch_s: float | None
) -> str:
    """The report page (see the module docstring)."""
    items = "".join(f"<li><b>{html.escape(a.cause)}.</b> {html.escape(a.remedy)}.</li>" for a in advice)
    advice_html = f"<ul class=advice>{items}</ul>" if advice else (
        "<p class=none>No rule found a cause to name.</p>")
    engines = max((e for e, _ in recorder.units), default=0) + 1
    figures = [
        _img(plots.throughput(recorder.samples, recorder.started), "Throughput over time",
             "Records read, elements out and batches out per second, over the run."),
        _img(plots.stages(stats), "Time per stage",
             "Seconds of each stage, added up over the processes that spent them, and the "
             "consumer's waiting in next()."),
        _img(plots.timeline(recorder.units, recorder.started, engines, recorder.depths),
             "Timeline of units per worker",
             "Each bar is one unit being computed by a worker (gaps: the worker was idle); "
             "the red rows are the waits: the loader's consumer for a unit and, with the "
             "device feed, the training step for a batch."),
        _img(plots.queues(recorder.units, recorder.depths, recorder.started), "Queue depths",
             "Units computed and not yet taken by the consumer, units being computed, and "
             "the device feed's queues."),
    ]
    if recorder.depths:
        figures.append(_img(plots.step_waiting(recorder.depths, recorder.started),
                            "The step's waiting share",
                            "The share of each stretch of time the training step waited for a batch."))
    glossary = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in GLOSSARY)
    raw = html.escape(json.dumps(stats, indent=1, default=str))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>granary report</title>
<style>{STYLE}</style></head><body>
<h1>Where the time went</h1><p class=sub>{html.escape(title)}</p>
<section id=counts>{_counts(stats, first_batch_s)}</section>
<section id=advice><h2>Advice</h2>{advice_html}</section>
<section id=plots><h2>Plots</h2>{"".join(figures)}</section>
<section id=workers><h2>Workers</h2>{_workers(stats)}</section>
<section id=glossary><h2>What the numbers mean</h2><dl>{glossary}</dl></section>
<details><summary>stats()</summary><pre>{raw}</pre></details>
</body></html>
"""


def write_report(
    directory: str, stats: dict[str, Any], recorder: Recorder, advice: list[Advice], *, title: str,
    first_batch_s: float | None,
) -> list[str]:
    """Writes ``stats.json`` and ``report.html`` into ``directory``; returns their paths.

    Each file is written beside its final name and renamed, so no half-written file is
    left if drawing fails.
    """
    check_report_dir(directory)
    data = {
        "title": title,
        "first_batch_s": first_batch_s,
        "stats": stats,
        "advice": [a._asdict() for a in advice],
        "started": recorder.started,
        "samples": [s._asdict() for s in recorder.samples],
        "units": [{"engine": e, **u._asdict()} for e, u in recorder.units],
        "device_depths": [d._asdict() for d in recorder.depths],
    }
    outputs = [
        ("stats.json", json.dumps(data, indent=1, default=str)),
        ("report.html", render(stats, recorder, advice, title, first_batch_s)),
    ]
    paths = []
    for name, text in outputs:
        path = os.path.join(directory, name)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
        paths.append(path)
    return paths
