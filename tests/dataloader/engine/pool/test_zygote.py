"""The fork server's own decisions, in this process: what it answers when it may not or
cannot fork, and how a waiting pool tells a stopped server."""

from __future__ import annotations

import errno
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading

import pytest

from dataloader.engine.pool import zygote
from dataloader.engine.pool.zygote import client, process_state
from dataloader.engine.pool.zygote.server import Server
from tests.helpers import wait_until


def _server() -> Server:
    mine, _theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    return Server(mine, os.getpid())


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_a_fork_that_fails_is_answered_with_the_reason_and_its_descriptors_are_closed(monkeypatch):
    def refuse():
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(threading, "active_count", lambda: 1)  # pytest may run threads
    server = _server()
    r, w = os.pipe()
    pid, error = server.fork([r, w], pool=1, cpus=(0,))
    assert pid is None
    assert error == "fork() failed: [Errno 11] Resource temporarily unavailable"
    assert _closed(r) and _closed(w) and not server.children


def test_a_server_with_another_thread_refuses_to_fork_without_a_reason(monkeypatch):
    forked = []
    monkeypatch.setattr(os, "fork", lambda: forked.append(1) or 0)
    monkeypatch.setattr(threading, "active_count", lambda: 2)
    r, w = os.pipe()
    assert _server().fork([r, w], pool=1, cpus=(0,)) == (None, None)
    assert not forked and _closed(r) and _closed(w)


def test_process_state_tells_a_stopped_process_from_a_running_and_a_gone_one():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # Running, sleeping, or in a disk wait while it loads on a busy machine: alive, not stopped.
        assert process_state(child.pid) in ("R", "S", "D")
        os.kill(child.pid, signal.SIGSTOP)
        assert wait_until(lambda: process_state(child.pid) == "T")
    finally:
        child.kill()
        child.wait()
    assert process_state(child.pid) == ""


def test_a_pool_closing_kills_only_its_own_children():
    server = _server()
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    try:
        server.children = {sleepers[0].pid: 1, sleepers[1].pid: 2}
        server.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        theirs.send(pickle.dumps(("close", 1)))
        assert server.handle()
        assert sleepers[0].wait(10) == -signal.SIGKILL
        assert sleepers[1].poll() is None and server.children == {sleepers[1].pid: 2}
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


def test_the_shared_server_is_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setattr(zygote, "ENABLED", False)
    assert zygote.shared() is None


@pytest.mark.parametrize("state", ["T", "t"])
def test_a_waiting_pool_loses_a_stopped_server_at_once(monkeypatch, state):
    """No answer comes and the server reads as stopped: the wait ends at the first look,
    not after ANSWER_WAIT_S, and the server is killed."""
    monkeypatch.setattr(client, "LOOK_S", 0.01)
    monkeypatch.setattr(client, "process_state", lambda pid: state)
    server = zygote.Zygote.__new__(zygote.Zygote)
    server._cond = threading.Condition()
    server.alive, server._closing, server.owner = True, False, os.getpid()
    killed = []
    server.proc = type("P", (), {"pid": 1, "kill": lambda self: killed.append(1)})()
    server._await(lambda: False, 3600.0)
    assert not server.alive and killed == [1]
