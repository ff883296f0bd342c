"""What a column is: one loader used one documented way, opened per host and scenario.

A column answers, without importing its loader (the parent process may not have it):

* ``name``, ``packages`` (the distributions whose versions the table lists);
* ``environment``: the virtual environment under ``benchmarks/`` its processes (and the
  writing of its data) run in, where its loader cannot be installed beside granary's
  (``""``: the matrix's own interpreter);
* ``missing()``: why it cannot run here (not installed, and the installer's reason), or None;
* ``unsupported(scenario)``: the loader's documented reason it has no way to do that
  scenario (quoted, with where it says so), or None;
* ``fmt(scenario)``: which of :data:`data.FORMATS` it reads;
* ``promises_order(scenario)``: whether its documentation promises the same order
  after a resume as without one (then a different order makes the cell fail);

and in the child process ``open(ctx, state)`` returns a :class:`Run` for one host:
``state`` is None (from the start), this host's checkpoint bytes, or (elastic) the list
of every old host's.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterator
from typing import Any, Protocol


class Run(Protocol):
    def __iter__(self) -> Iterator[list[int]]:
        """The ids of each step (one batch), over every epoch of the scenario."""

    def save(self) -> bytes:
        """The checkpoint of the last step handed out, as bytes."""

    def close(self) -> None: ...


class Column:
    name = ""
    packages: tuple[str, ...] = ()
    environment = ""

    def missing(self) -> str | None:
        for package in self.packages:
            try:
                importlib.metadata.version(package)
            except importlib.metadata.PackageNotFoundError:
                return f"{package} is not installed in this environment"
        return None

    def unsupported(self, scenario: str) -> str | None:
        return None

    def fmt(self, scenario: str) -> str:
        return "array_record"

    def promises_order(self, scenario: str) -> bool:
        return scenario != "elastic"

    def open(self, ctx: Any, state: Any) -> Run:
        raise NotImplementedError


def versions(packages: tuple[str, ...]) -> dict[str, str]:
    found = {}
    for package in packages:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


# Several hosts in one process, for loaders that learn their rank from the environment.
# LitData and MosaicML ``streaming`` read the world size and rank from environment
# variables (as a launcher sets them) when they build, when they iterate (their workers
# fork then) and when they save. The elastic scenario runs every host of a job in one
# process, one step each in turn: each of those calls runs with its host's variables.
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
