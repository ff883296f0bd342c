"""Several hosts in one process, for loaders that learn their rank from the environment.

LitData and MosaicML ``streaming`` read the world size and rank from environment
variables (as a launcher sets them) when they build, when they iterate (their workers
fork then) and when they save. The elastic scenario runs every host of a job in one
process, one step each in turn: each of those calls runs with its host's variables.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any


class OnHost:
    """A context in which the environment says this host's rank."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def __enter__(self) -> OnHost:
        os.environ.update(self.env)
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def wrap(self, run: Any) -> HostRun:
        return HostRun(self, run)


class HostRun:
    """A run whose every step and save happen on its host."""

    def __init__(self, host: OnHost, run: Any) -> None:
        self.host, self.run = host, run

    def __iter__(self) -> Iterator[list[int]]:
        it = iter(self.run)
        while True:
            with self.host:
                try:
                    ids = next(it)
                except StopIteration:
                    return
            yield ids

    def save(self) -> bytes:
        with self.host:
            return self.run.save()

    def close(self) -> None:
        self.run.close()
