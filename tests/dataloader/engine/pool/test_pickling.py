"""What granary sends to its workers unpickles, or the object that does not is named.

These run in one process: the pickle is checked here exactly as the loader checks it
before starting workers (tests/integration/test_torchtitan_shape.py runs such a pipeline
on workers).
"""

from __future__ import annotations

import functools
import pickle
import re
import threading

import cloudpickle
import jinja2
import jinja2.sandbox
import numpy as np
import pytest

import dataloader as dl
from dataloader.engine.pool.pickling import PickledPlan, dumps_checked, register_reducer, round_trip
from dataloader.engine.pool.pickling.unpicklable import find_unpicklable

TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"


class ChatTokenizer:
    """A tokenizer that compiles its chat template, as Hugging Face's and torchtitan's do
    (a sandboxed environment whose globals include a closure)."""

    def __init__(self, template: str) -> None:
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True)

        def raise_exception(msg: str) -> None:
            raise jinja2.exceptions.TemplateError(msg)

        env.globals["raise_exception"] = raise_exception
        self.chat_template = env.from_string(template)

    def render(self, messages: list[dict[str, str]]) -> str:
        return self.chat_template.render(messages=messages)


class NeedsSource:
    """A class whose ``__new__`` needs an argument (jinja2.Template's shape): its default
    reduction calls ``NeedsSource.__new__(NeedsSource)`` on load, which raises."""

    def __new__(cls, source: str) -> NeedsSource:
        obj = super().__new__(cls)
        obj.compiled = source.upper()
        return obj


class LockedPattern:
    """Holds a lock (cannot be pickled) beside what rebuilds it (its pattern)."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.lock = threading.Lock()


class BreaksOnLoad:
    """Pickles, but cannot be rebuilt in another process."""

    def __init__(self) -> None:
        self.value = 1

    def __setstate__(self, state: dict) -> None:
        raise RuntimeError("this object refuses to be rebuilt")


class Holder:
    def __init__(self, inner: object) -> None:
        self.inner = inner


def test_a_compiled_jinja2_template_travels_and_renders_the_same():
    tok = ChatTokenizer(TEMPLATE)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'source'"):
        pickle.loads(cloudpickle.dumps(tok))  # what a worker met before
    loaded = pickle.loads(dumps_checked(tok, "operations[0]"))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert loaded.render(messages) == tok.render(messages) == "<user>hi<assistant>hello"
    assert type(loaded.chat_template) is jinja2.Template
    with pytest.raises(jinja2.exceptions.SecurityError):  # still the sandbox it was made in
        loaded.chat_template.environment.from_string("{{ ''.__class__.__mro__ }}").render()


def test_a_class_whose_new_needs_arguments_is_rebuilt_with_its_state():
    loaded = pickle.loads(dumps_checked([NeedsSource("abc")], "data_source"))[0]
    assert type(loaded) is NeedsSource
    assert loaded.compiled == "ABC"


def test_a_registered_reducer_is_used_for_the_workers_only():
    with pytest.raises(TypeError, match=r"^operations\[1\]\.lock \(a _thread\.lock.*cannot be sent to worker"):
        dumps_checked([1, LockedPattern("x+")], "the pipeline",
                      [("operations[0]", 1, ""), ("operations[1]", LockedPattern("x+"), "")])
    register_reducer(LockedPattern, lambda p: (LockedPattern, (p.pattern,)))
    try:
        loaded = pickle.loads(dumps_checked(LockedPattern("x+"), "operations[0]"))
        assert loaded.pattern == "x+"
        assert isinstance(loaded.lock, type(threading.Lock()))
        with pytest.raises(TypeError, match="lock"):
            pickle.dumps(LockedPattern("x+"))  # the process's own pickling is unchanged
    finally:
        register_reducer(LockedPattern, None)
    with pytest.raises(TypeError, match="cannot be sent"):  # and the registration is gone
        dumps_checked(LockedPattern("x+"), "operations[0]")


def test_register_reducer_refuses_what_is_not_a_class_or_a_callable():
    with pytest.raises(TypeError, match="needs a class, got 'Template'"):
        register_reducer("Template", lambda t: (str, ()))
    with pytest.raises(TypeError, match="needs a callable reducer, got 'not callable'"):
        register_reducer(Holder, "not callable")


def test_an_object_that_does_not_unpickle_is_named_by_its_path():
    ops = [dl.MapTransform(lambda x: x), Holder({"tokenizer": Holder(BreaksOnLoad())})]
    parts = [(f"operations[{i}]", op, f"operation {i}") for i, op in enumerate(ops)]
    with pytest.raises(TypeError) as info:
        dumps_checked(ops, "the pipeline", parts)
    message = str(info.value)
    assert message.startswith("operations[1].inner['tokenizer'].inner (a ")
    assert "BreaksOnLoad: " in message and ", in operation 1, pickles but" in message
    assert "BreaksOnLoad" in message
    assert "pickles but cannot be unpickled" in message
    assert "RuntimeError: this object refuses to be rebuilt" in message
    assert "register_reducer(BreaksOnLoad" in message


def test_the_path_goes_through_partials_closures_and_bound_methods():
    broken = BreaksOnLoad()

    def uses_broken(x):
        return broken, x

    found = find_unpicklable([("operations[0]", functools.partial(print, uses_broken))], round_trip)
    assert found is not None
    assert found.path == "operations[0].args[0].__closure__['broken']"
    assert found.obj is broken
    assert found.part == "operations[0]"
    assert "refuses" in str(found.error)

    method = Holder(broken).__init__  # a bound method: its object is part of it
    found = find_unpicklable([("operations[1]", method)], round_trip)
    assert found is not None and found[0] == "operations[1].__self__.inner"
    assert find_unpicklable([("operations[2]", ChatTokenizer(TEMPLATE).render)], round_trip) is None


def test_the_modules_the_objects_come_from_are_recorded():
    plan = dumps_checked([ChatTokenizer(TEMPLATE), np.zeros(3), re.compile("a")], "the pipeline")
    assert isinstance(plan, PickledPlan)
    assert isinstance(plan, bytes)
    assert {"jinja2.environment", "numpy", __name__, "re"} <= set(plan.modules)
