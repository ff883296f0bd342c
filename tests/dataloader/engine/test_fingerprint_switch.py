"""The per-step fingerprint is a switch: ``DataLoader(fingerprint=)``, ``DatasetOptions
(fingerprint=)``, the config's ``loader.fingerprint`` and ``$GRANARY_FINGERPRINT`` (for code
that cannot be edited). Off, states carry none and a restore checks none: what it loses is
the audit that refuses a state whose data or operations changed."""

from __future__ import annotations

import pytest

import dataloader as dl
import dataloader.experimental as ge
from dataloader.config import parse_config
from dataloader.engine.compute import compute_unit
from dataloader.errors import ConfigError, StateMismatchError
from dataloader.options import FINGERPRINT_ENV
from tests.dataloader.engine.test_fingerprint import FixedWidthFile, write_records


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv(FINGERPRINT_ENV, raising=False)


def loader(path, **kwargs):
    return dl.DataLoader(FixedWidthFile(str(path)), dl.IndexSampler(40, shuffle=True, seed=3, num_epochs=1),
                         [dl.Batch(4)], **kwargs)


def saved_at_step_5(path):
    """A state saved with the fingerprint on, after five batches."""
    write_records(path, 40)
    it = iter(loader(path, fingerprint=True))
    for _ in range(5):
        next(it)
    return it.get_state(), [b.tolist() for b in it]


def test_off_states_carry_no_fingerprint_and_units_no_digests(tmp_path):
    write_records(tmp_path / "r", 40)
    off = loader(tmp_path / "r", fingerprint=False)
    it = iter(off)
    next(it)
    assert "fingerprint" not in it.get_state()
    assert compute_unit(off.plan, 0, 4).sources is None
    assert compute_unit(loader(tmp_path / "r").plan, 0, 4).sources is not None  # on by default


def test_off_a_restore_checks_nothing_where_on_it_refuses_changed_data(tmp_path):
    path = tmp_path / "r"
    state, rest = saved_at_step_5(path)
    write_records(path, 40, changed=int(dl.IndexSampler(40, shuffle=True, seed=3, num_epochs=1).record_keys([17])[0]))
    with pytest.raises(StateMismatchError, match="source bytes of record"):
        loader(path).iterator(state)
    resumed = loader(path, fingerprint=False).iterator(state)  # no audit: it goes on
    assert len([b.tolist() for b in resumed]) == len(rest)
    # Off, a state saved with it on can still be checked when asked for.
    with pytest.raises(StateMismatchError, match="source bytes of record"):
        loader(path, fingerprint=False, verify_on_restore=True).iterator(state)


def test_the_environment_sets_the_default_and_an_explicit_argument_wins(tmp_path, monkeypatch):
    write_records(tmp_path / "r", 40)
    monkeypatch.setenv(FINGERPRINT_ENV, "0")
    assert not loader(tmp_path / "r").plan.fingerprint
    assert loader(tmp_path / "r", fingerprint=True).plan.fingerprint
    ds = dl.MapDataset.range(20).shuffle(seed=1).batch(4).to_iter_dataset()  # Grain code, unedited
    it = iter(ds)
    next(it)
    assert "fingerprint" not in it.get_state()
    monkeypatch.setenv(FINGERPRINT_ENV, "on")
    assert loader(tmp_path / "r").plan.fingerprint


def test_a_bad_environment_value_is_refused_when_a_loader_is_built(tmp_path, monkeypatch):
    write_records(tmp_path / "r", 40)
    monkeypatch.setenv(FINGERPRINT_ENV, "maybe")
    with pytest.raises(ValueError, match=r"GRANARY_FINGERPRINT='maybe' is not a switch; set it to 0"):
        loader(tmp_path / "r")


def test_dataset_options_turn_it_off_for_the_datasets_below():
    ds = dl.MapDataset.range(20).shuffle(seed=1).batch(4).to_iter_dataset()
    it = iter(ge.WithOptionsIterDataset(ds, ge.DatasetOptions(fingerprint=False)))
    next(it)
    assert "fingerprint" not in it.get_state()
    it = iter(ge.WithOptionsIterDataset(ds, ge.DatasetOptions(fingerprint=True)))
    next(it)
    assert "fingerprint" in it.get_state()
    with pytest.raises(TypeError, match=r"DatasetOptions.fingerprint must be True or False, got 0"):
        ge.DatasetOptions(fingerprint=0)


def _config(loader_section):
    return {"source": {"kind": "dataloader.sources.RangeDataSource", "options": {"start": 20}},
            "operations": [{"batch": 4}], "loader": loader_section}


def test_the_configs_loader_key_turns_it_off():
    built = parse_config(_config({"fingerprint": False})).build_loader()
    assert not built.plan.fingerprint
    assert parse_config(_config({})).build_loader().plan.fingerprint
    with pytest.raises(ConfigError, match=r"loader.fingerprint: expected true or false, got 'no'"):
        parse_config(_config({"fingerprint": "no"}))
