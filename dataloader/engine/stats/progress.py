"""A small progress bar on stderr for the command line (no dependency).

On a terminal it redraws one line at most ten times a second; when stderr is a file or
a pipe it writes a line every ``log_every_s`` seconds instead, so logs stay short. A
``detail`` callable adds live numbers to the line (``run`` shows the records read per
second and the slowest stage there).

Example:
    >>> with Progress("converting", total=3, unit="records") as bar:  # doctest: +SKIP
    ...     for _ in range(3):
    ...         bar.update()
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


class Progress:
    """Counts work done and shows it, with the rate, on ``stream`` (stderr).

    Args:
        label: what is being done, shown first.
        total: how much there is in all, or ``None`` when unknown (no bar then).
        unit: what is counted ("records", "batches").
        stream: where to draw; stderr by default.
        log_every_s: seconds between lines when ``stream`` is not a terminal.
        detail: called at each redraw; its text ends the line (after ``|``, in place of
            the count's rate) when not empty.
    """

    WIDTH = 30

    def __init__(
        self,
        label: str,
        total: int | None = None,
        unit: str = "records",
        stream: TextIO | None = None,
        log_every_s: float = 10.0,
        detail: Callable[[], str] | None = None,
    ) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.detail = detail
        self.stream = stream if stream is not None else sys.stderr
        self.count = 0
        self.started = time.perf_counter()
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._interval = 0.1 if self._tty else log_every_s
        self._last_draw = self.started
        self._drawn = 0  # the length of the line on the terminal
        self._closed = False

    def update(self, n: int = 1) -> None:
        self.count += n
        now = time.perf_counter()
        if now - self._last_draw >= self._interval:
            self._last_draw = now
            self._draw(final=False)

    def line(self) -> str:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        extra = self.detail() if self.detail is not None else ""
        # The detail has the rates of the last seconds; the count's own rate, since the
        # start, is shown only without it.
        rate = f" | {extra}" if extra else f" {self.count / elapsed:,.0f} {self.unit}/s"
        if self.total:
            done = min(self.count / self.total, 1.0)
            filled = int(done * self.WIDTH)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            return f"{self.label} [{bar}] {self.count:,}/{self.total:,} {self.unit}{rate}"
        return f"{self.label} {self.count:,} {self.unit}{rate}"

    def _draw(self, final: bool) -> None:
        if self._tty:
            line = self.line()
            # Spaces over what a longer previous line left on the screen.
            self.stream.write("\r" + line.ljust(self._drawn) + ("\n" if final else ""))
            self._drawn = len(line)
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Draws the final line (once)."""
        if not self._closed:
            self._closed = True
            self._draw(final=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
