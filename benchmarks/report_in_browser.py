"""Opens a ``run --report`` page in a real headless browser and checks what a person sees.

The suite checks the page's HTML (self-contained, every plot a PNG data URI:
tests/dataloader/cli/test_run.py); this script checks it the way a person meets it:

1. runs ``python -m dataloader run CONFIG --report=DIR --step_ms=2`` on a pipeline made
   here (two workers, the device feed, a map that costs some CPU);
2. loads a copy of the page, with a check added at its end, in headless Chromium with
   every host name unresolvable (so anything fetched from the network would fail), and
   reads back from the DOM how many images decoded and how big they are;
3. takes a screenshot of the page itself (``--screenshot=PATH``, docs/images/report.png by
   default), shrunk to a small palette PNG.

Chromium comes from Debian's packages (``apt-get install -y chromium``, as root); the
browser is not a dependency of the project or of its CI. Usage::

    python benchmarks/report_in_browser.py [--screenshot docs/images/report.png]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # nothing on the network can be reached
]
CHECK = """<script>
window.addEventListener("load", () => {
  const images = [...document.images];
  const good = images.filter(i => i.complete && i.naturalWidth > 0);
  document.body.setAttribute("data-check",
    `${images.length} images, ${good.length} decoded, sizes ` +
    good.map(i => `${i.naturalWidth}x${i.naturalHeight}`).join(" "));
});
</script>"""

CONFIG = """\
source: {kind: dataloader.sources.RangeDataSource, options: {start: 6000}}
sampler: {shuffle: true, seed: 0, num_epochs: 1}
operations:
  - map: report_in_browser_ops.features
  - batch: {batch_size: 32, drop_remainder: true}
loader: {worker_count: 2}
device: {enabled: true}
"""
OPS = """\
import numpy as np

def features(i):
    x = np.random.default_rng(i).random((64, 64), dtype=np.float32)
    return {"x": np.linalg.svd(x, compute_uv=False)[:8], "label": i % 10}
"""


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        sys.exit("no Chromium: install it with `apt-get install -y chromium` (as root)")
    return found


def browse(browser: str, page: Path, profile: Path, *extra: str) -> str:
    done = subprocess.run(
        [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra, page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    if done.returncode != 0:
        sys.exit(f"chromium failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def shrink(png: Path, out: Path, width: int = 900) -> None:
    """The screenshot at ``width`` pixels, in a 128-colour palette: small enough to commit."""
    from PIL import Image

    image = Image.open(png).convert("RGB")
    image = image.resize((width, round(image.height * width / image.width)), Image.LANCZOS)
    image.quantize(colors=128, method=Image.Quantize.FASTOCTREE).save(out, optimize=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--screenshot", type=Path, default=HERE.parent / "docs" / "images" / "report.png")
    parser.add_argument("--height", type=int, default=1700, help="pixels of the page in the screenshot")
    args = parser.parse_args(argv)
    browser = chromium()
    with tempfile.TemporaryDirectory(prefix="granary-report-") as tmp:
        work = Path(tmp)
        (work / "pipeline.yaml").write_text(CONFIG)
        (work / "report_in_browser_ops.py").write_text(OPS)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work), str(ROOT)])}
        run = subprocess.run(
            [sys.executable, "-m", "dataloader", "run", "pipeline.yaml", "--report=report", "--step_ms=2"],
            cwd=work, env=env, capture_output=True, text=True, timeout=300,
        )
        if run.returncode != 0:
            sys.exit(f"run failed: {run.stderr[-3000:]}")
        print(run.stdout)
        page = work / "report" / "report.html"
        text = page.read_text()
        checked = work / "checked.html"
        checked.write_text(text.replace("</body>", CHECK + "</body>"))
        dom = browse(browser, checked, work / "profile-1", "--dump-dom", "--virtual-time-budget=5000")
        found = re.search(r'data-check="(\d+) images, (\d+) decoded, sizes ([^"]*)"', dom)
        if found is None:
            sys.exit("the page's check did not run: " + dom[:500])
        total, decoded = int(found.group(1)), int(found.group(2))
        print(f"browser: {total} images, {decoded} decoded ({found.group(3)})")
        if total == 0 or decoded != total:
            sys.exit("some plots did not decode in the browser")
        shot = work / "shot.png"
        browse(browser, page, work / "profile-2", f"--screenshot={shot}", f"--window-size=1000,{args.height}")
        shrink(shot, args.screenshot)
        print(f"screenshot: {args.screenshot} ({args.screenshot.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
