"""The report's plots, drawn with matplotlib (the ``report`` extra) as PNG bytes.

Figures are made with ``matplotlib.figure.Figure`` directly, never through pyplot, so
drawing a report neither needs a display nor changes the backend of a program that
imports this. Times are seconds since the recording started.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from dataloader.engine.stats.shape import MAIN

# Paul Tol's colour-blind safe set; red is kept for waiting, nothing else uses it.
COLORS = ["#4477aa", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb", "#332288"]
WAIT_COLOR = "#ee6677"
MIN_WAIT_S = 0.0005  # consumer waits shorter than this are left off the timeline


def _figure(height: float = 3.0) -> Any:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.0, height), dpi=100, layout="constrained")
    return fig, fig.add_subplot()


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def throughput(samples: Sequence[Any], started: float) -> bytes:
    """Records read, elements out (per second, left) and batches out (right) over time."""
    fig, ax = _figure()
    times, records, elements, batches = [], [], [], []
    step = max(1, len(samples) // 80)  # about 80 points, each over `step` samples
    for before, after in zip(samples[::step], samples[step::step]):
        span = after.at - before.at
        if span <= 0:
            continue
        times.append(after.at - started)
        records.append((after.records_read - before.records_read) / span)
        elements.append((after.elements_out - before.elements_out) / span)
        batches.append((after.batches_out - before.batches_out) / span)
    ax.step(times, records, where="pre", color=COLORS[0], label="records read/s")
    ax.step(times, elements, where="pre", color=COLORS[1], label="elements out/s", linestyle="--")
    ax.set_xlabel("seconds")
    ax.set_ylabel("per second")
    ax.set_ylim(bottom=0)
    right = ax.twinx()
    right.step(times, batches, where="pre", color=COLORS[4], label="batches out/s")
    right.set_ylabel("batches/s")
    right.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    ax.legend(lines, [line.get_label() for line in lines], loc="lower right", fontsize="small")
    ax.set_title("Throughput over time")
    return _png(fig)


def stages(stats: dict[str, Any]) -> bytes:
    """Seconds per stage (added up over processes), and the consumer's waiting."""
    items = sorted(stats["stage_seconds"].items(), key=lambda kv: kv[1])
    names = [name for name, _ in items] + ["consumer waiting in next()"]
    values = [secs for _, secs in items] + [stats["wait_s"]]
    fig, ax = _figure(0.6 + 0.35 * len(names))
    bars = ax.barh(names, values, color=[COLORS[0]] * len(items) + [WAIT_COLOR])
    ax.bar_label(bars, labels=[f"{v:.3f} s" for v in values], fontsize="small", padding=3)
    ax.set_xlabel("seconds")
    ax.set_xlim(0, max(values or [1.0]) * 1.2 or 1.0)
    ax.set_title("Time per stage")
    return _png(fig)


def _worker_order(key: str) -> tuple[str, bool, int, str]:
    engine, _, worker = key.rpartition("/")
    return (engine, worker == MAIN, int(worker) if worker.isdigit() else 0, worker)


def timeline(
    units: Sequence[tuple[int, Any]], started: float, engines: int, depths: Sequence[Any] = ()
) -> bytes:
    """Each worker's units as bars (busy; gaps are idle), when the loader's consumer
    waited for a unit, and (device feed) when the training step waited for a batch."""
    rows: dict[str, list[tuple[float, float]]] = {}
    waits: list[tuple[float, float]] = []
    for engine, unit in units:
        key = f"{engine}/{unit.worker}" if engines > 1 else unit.worker
        rows.setdefault(key, []).append((unit.began - started, max(unit.ended - unit.began, 1e-6)))
        if unit.got - unit.asked >= MIN_WAIT_S:
            waits.append((unit.asked - started, unit.got - unit.asked))
    names = sorted(rows, key=_worker_order)
    labels = [f"worker {n}" if n.rpartition("/")[2] != MAIN else f"{n} (this process)" for n in names]
    bars = [rows[name] for name in names] + [waits]
    labels.append("loader's consumer waiting" if depths else "consumer waiting")
    if depths:
        bars.append([(d.at - started, d.waited) for d in depths if d.waited >= MIN_WAIT_S])
        labels.append("training step waiting")
    fig, ax = _figure(1.0 + 0.45 * len(bars))
    for i, row in enumerate(bars):
        waiting = i >= len(names)
        ax.broken_barh(row, (i - 0.35, 0.7), color=WAIT_COLOR if waiting else COLORS[i % len(COLORS)])
    ax.set_yticks(range(len(bars)), labels)
    ax.set_xlabel("seconds")
    ax.set_title("Units per worker: bars are units being computed, gaps are idle")
    return _png(fig)


def _steps(events: list[tuple[float, int]]) -> tuple[list[float], list[int]]:
    events.sort()
    times, depths, depth = [], [], 0
    for at, change in events:
        depth += change
        times.append(at)
        depths.append(depth)
    return times, depths


def queues(units: Sequence[tuple[int, Any]], depths: Sequence[Any], started: float) -> bytes:
    """Units computed and not yet taken (ready), units being computed (in flight), and
    the device feed's queues when there is one."""
    ready: list[tuple[float, int]] = []
    flight: list[tuple[float, int]] = []
    for _, unit in units:
        flight += [(unit.began - started, 1), (unit.ended - started, -1)]
        if unit.got > unit.ended:
            ready += [(unit.ended - started, 1), (unit.got - started, -1)]
    fig, ax = _figure()
    for events, label, color in ((ready, "units ready, not yet taken", COLORS[1]),
                                 (flight, "units being computed", COLORS[0])):
        times, values = _steps(events)
        ax.step(times, values, where="post", label=label, color=color)
    if depths:
        at = [d.at - started for d in depths]
        ax.step(at, [d.host for d in depths], where="post", label="device feed: host queue", color=COLORS[2])
        ax.step(at, [d.device for d in depths], where="post", label="device feed: on devices", color=COLORS[4])
    ax.set_xlabel("seconds")
    ax.set_ylabel("depth")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize="small", framealpha=0.8)
    ax.set_title("Queue depths")
    return _png(fig)


def step_waiting(depths: Sequence[Any], started: float, bins: int = 40) -> bytes:
    """The share of each stretch of time the training step spent waiting for a batch."""
    fig, ax = _figure(2.6)
    if depths:
        first, last = depths[0].at, max(d.at + d.waited for d in depths)
        width = max((last - first) / bins, 1e-3)
        waited = [0.0] * bins
        for d in depths:
            waited[min(bins - 1, int((d.at - first) / width))] += d.waited
        ax.bar([first - started + (i + 0.5) * width for i in range(bins)],
               [min(1.0, w / width) for w in waited], width=width * 0.9, color=WAIT_COLOR)
    ax.set_ylim(0, 1)
    ax.set_xlabel("seconds")
    ax.set_ylabel("share waiting")
    ax.set_title("The training step's waiting share (device feed)")
    return _png(fig)
