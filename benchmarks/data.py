"""Deterministic benchmark data sets, written as ArrayRecord files (group_size 1).

Three data sets, each in ``benchmarks/data/<name>/`` with a ``manifest.json``:

* ``raw``:  200,000 records of 1,024 random bytes (decoder ``none``).
* ``png``:  50,000 PNG-encoded 32x32 grayscale images of about 1 KB (``png``).
* ``jpeg``: 5,000 JPEG-encoded 512x512 RGB images of about 150 KB (``jpeg``).

Every record is a pure function of (data set seed, record index), so two machines
make the same bytes. A data set whose manifest matches the requested parameters
is left alone; otherwise it is written anew. Files are written in parallel, one
process per file.

Run ``python benchmarks/data.py [--only raw,png]`` to make them ahead of time;
``run.py`` calls :func:`ensure` itself.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import io
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

DATA_DIR = Path(__file__).resolve().parent / "data"
# Bump when a generator changes, so old files are not taken for new ones.
GENERATOR_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Spec:
    """What one data set is made of; the manifest stores it to detect changes."""

    name: str
    num_records: int
    num_files: int
    seed: int
    decoder: str
    params: dict = dataclasses.field(default_factory=dict)

    def files(self, root: Path = DATA_DIR) -> list[Path]:
        return [
            root / self.name / f"{self.name}-{i:05d}-of-{self.num_files:05d}.array_record"
            for i in range(self.num_files)
        ]

    def manifest(self) -> dict:
        return {"generator_version": GENERATOR_VERSION, **dataclasses.asdict(self)}


SPECS: dict[str, Spec] = {
    "raw": Spec("raw", 200_000, 4, seed=1, decoder="none", params={"record_bytes": 1024}),
    # Measured: noise 28 gives PNGs of about 1.0 KB (min ~0.8, max ~1.1).
    "png": Spec("png", 50_000, 2, seed=2, decoder="png", params={"side": 32, "noise": 28}),
    # Measured: noise 28 at quality 93 gives JPEGs of about 150 KB (+-2 KB).
    "jpeg": Spec(
        "jpeg", 5_000, 4, seed=3, decoder="jpeg", params={"side": 512, "noise": 28, "quality": 93}
    ),
}


# --------------------------------------------------------------------- records


def _raw_records(spec: Spec, start: int, stop: int) -> Iterator[bytes]:
    # One generator per block of records keeps this fast and still a pure
    # function of (seed, index): a block always starts at a multiple of 4096.
    size = spec.params["record_bytes"]
    block = 4096
    for block_start in range(start - start % block, stop, block):
        rng = np.random.default_rng([spec.seed, block_start])
        rows = rng.integers(0, 256, size=(block, size), dtype=np.uint8)
        for i in range(max(start, block_start), min(stop, block_start + block)):
            yield rows[i - block_start].tobytes()


def _shapes(draw, rng: np.random.Generator, count: int, side: int, lo: int, hi: int, rgb: bool):
    for _ in range(count):
        x0, y0 = (int(v) for v in rng.integers(0, side - lo, 2))
        x1, y1 = x0 + int(rng.integers(lo, hi)), y0 + int(rng.integers(lo, hi))
        colour = (
            tuple(int(v) for v in rng.integers(0, 256, 3)) if rgb else int(rng.integers(0, 256))
        )
        shape = draw.rectangle if rng.random() < 0.5 else draw.ellipse
        shape([x0, y0, x1, y1], fill=colour)


def _add_noise(image, rng: np.random.Generator, amplitude: int) -> np.ndarray:
    pixels = np.asarray(image, dtype=np.int16)
    pixels = pixels + rng.integers(-amplitude, amplitude + 1, pixels.shape, dtype=np.int16)
    return np.clip(pixels, 0, 255).astype(np.uint8)


def _png_records(spec: Spec, start: int, stop: int) -> Iterator[bytes]:
    from PIL import Image, ImageDraw

    side, noise = spec.params["side"], spec.params["noise"]
    for i in range(start, stop):
        rng = np.random.default_rng([spec.seed, i])
        image = Image.new("L", (side, side), int(rng.integers(0, 256)))
        _shapes(ImageDraw.Draw(image), rng, 3, side, 4, 20, rgb=False)
        out = io.BytesIO()
        Image.fromarray(_add_noise(image, rng, noise)).save(out, "PNG")
        yield out.getvalue()


def _jpeg_records(spec: Spec, start: int, stop: int) -> Iterator[bytes]:
    from PIL import Image, ImageDraw

    side, noise, quality = (spec.params[k] for k in ("side", "noise", "quality"))
    y, x = np.mgrid[0:side, 0:side].astype(np.float32) / side
    for i in range(start, stop):
        rng = np.random.default_rng([spec.seed, i])
        freq, phase = rng.uniform(2, 12, 3), rng.uniform(0, 2 * np.pi, 3)
        waves = [
            127
            + 100
            * np.sin(2 * np.pi * freq[c] * x + phase[c])
            * np.cos(2 * np.pi * freq[(c + 1) % 3] * y)
            for c in range(3)
        ]
        image = Image.fromarray(np.clip(np.stack(waves, -1), 0, 255).astype(np.uint8))
        _shapes(ImageDraw.Draw(image), rng, 20, side, 20, 200, rgb=True)
        out = io.BytesIO()
        Image.fromarray(_add_noise(image, rng, noise)).save(out, "JPEG", quality=quality)
        yield out.getvalue()


_GENERATORS: dict[str, Callable[[Spec, int, int], Iterator[bytes]]] = {
    "raw": _raw_records,
    "png": _png_records,
    "jpeg": _jpeg_records,
}


# --------------------------------------------------------------------- writing


def _write(path: Path, records: Iterator[bytes]) -> tuple[int, int]:
    """Writes ``records`` to ``path`` with group_size 1; returns (count, bytes)."""
    # Imported here: run.py imports this module in every peer's child process.
    from dataloader.sources import write_array_record

    total = 0

    def counted() -> Iterator[bytes]:
        nonlocal total
        for record in records:
            total += len(record)
            yield record

    count = write_array_record(str(path), counted(), group_size=1)
    return count, total


def _write_file(spec: Spec, file_index: int, path: str) -> tuple[int, int]:
    per_file = -(-spec.num_records // spec.num_files)
    start = file_index * per_file
    stop = min(spec.num_records, start + per_file)
    return _write(Path(path), _GENERATORS[spec.name](spec, start, stop))


def is_current(spec: Spec, root: Path = DATA_DIR) -> bool:
    """True if ``root/<name>`` holds exactly this spec's files."""
    manifest = root / spec.name / "manifest.json"
    try:
        stored = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False
    return {k: v for k, v in stored.items() if k != "stats"} == spec.manifest() and all(
        p.exists() for p in spec.files(root)
    )


def ensure(name: str, root: Path = DATA_DIR, log: Callable[[str], None] = print) -> list[str]:
    """Makes data set ``name`` unless already current; returns its file paths."""
    spec = SPECS[name]
    if is_current(spec, root):
        return [str(p) for p in spec.files(root)]
    directory = root / spec.name
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    log(f"writing data set {name!r}: {spec.num_records} records in {spec.num_files} files ...")
    started = time.perf_counter()
    finals = spec.files(root)
    workers = min(spec.num_files, os.cpu_count() or 1)
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        results = list(
            pool.map(_write_file, [spec] * spec.num_files, range(spec.num_files), map(str, finals))
        )
    count = sum(r[0] for r in results)
    total = sum(r[1] for r in results)
    stats = {"mean_record_bytes": round(total / count, 1), "total_bytes": total}
    # The manifest goes last: a crash half way leaves no manifest, so a rerun rewrites
    # (each file itself appears whole or not at all: write_array_record renames it in).
    (directory / "manifest.json").write_text(
        json.dumps({**spec.manifest(), "stats": stats}, indent=2)
    )
    log(
        f"  done in {time.perf_counter() - started:.1f}s: "
        f"{count} records, mean {stats['mean_record_bytes'] / 1024:.2f} KiB"
    )
    return [str(p) for p in finals]


def manifest(name: str, root: Path = DATA_DIR) -> dict:
    return json.loads((root / name / "manifest.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", default=",".join(SPECS), help="comma-separated data sets")
    args = parser.parse_args(argv)
    for name in args.only.split(","):
        if name not in SPECS:
            parser.error(f"unknown data set {name!r}; choose from {sorted(SPECS)}")
        ensure(name)
        print(f"{name}: {json.dumps(manifest(name)['stats'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
