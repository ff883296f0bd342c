"""MaxText's mixtures: the ``;`` spelling and the named JSON file, checked where they are read."""

from __future__ import annotations

import json

import pytest

import dataloader as dl
from dataloader.maxtext import load_mixture_config, mixture_parts, parse_maxtext_config


def test_mixtures_in_maxtexts_spelling_and_in_ours():
    assert mixture_parts("a*.array_record") == [("a*.array_record", 1.0)]
    assert mixture_parts("a*.ar,0.3;b*.ar,0.7") == [("a*.ar", 0.3), ("b*.ar", 0.7)]
    assert mixture_parts("gs://x/a*.ar:1;b*.ar:3") == [("gs://x/a*.ar", 0.25), ("b*.ar", 0.75)]


def _write(tmp_path, content, name="mix.json"):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def test_a_mixture_file_gives_named_components_sorted_by_name(tmp_path):
    path = _write(tmp_path, {"web": {"path": "w-*.array_record", "weight": 3},
                             "books": {"path": "b-*.array_record", "weight": "0.5", "note": "kept out"}})
    assert load_mixture_config(path) == (("books", "b-*.array_record", 0.5), ("web", "w-*.array_record", 3.0))


def test_the_config_reads_the_mixture_file_instead_of_the_files(tmp_path, base_keys):
    path = _write(tmp_path, {"a": {"path": "a*", "weight": 1}})
    config = parse_maxtext_config({**base_keys, "grain_train_mixture_config_path": path})
    assert config.train_files is None and config.train_mixture == (("a", "a*", 1.0),)
    del base_keys["grain_train_files"]
    assert parse_maxtext_config({**base_keys, "grain_train_mixture_config_path": path}).train_mixture
    with pytest.raises(dl.ConfigError, match=r"grain_train_files: missing; this key is required \(or "
                                             r"grain_train_mixture_config_path\)"):
        parse_maxtext_config(base_keys)


@pytest.mark.parametrize(("content", "message"), [
    ("{\"a\": {\"path\": \"x\",", r"the mixture file '.*mix.json' is not valid JSON: Expecting"),
    ([["x", 1]], r"the mixture file '.*mix.json' must hold an object .* got \[\['x', 1\]\]"),
    ({}, r"the mixture file '.*mix.json' must hold an object .* at least one component, got \{\}"),
    ({"web": {"weight": 1}}, r"'.*mix.json': component 'web' has no \"path\" \(it has \['weight'\]\)"),
    ({"web": {"path": "", "weight": 1}}, r"component 'web' \"path\" must be a non-empty file pattern, got ''"),
    ({"web": {"path": "w*"}}, r"component 'web' has no \"weight\" \(it has \['path'\]\)"),
    ({"web": {"path": "w*", "weight": 0}}, r"component 'web' \"weight\" must be a number > 0, got 0; leave"),
    ({"web": {"path": "w*", "weight": -0.5}}, r"component 'web' \"weight\" must be a number > 0, got -0.5"),
    ({"web": {"path": "w*", "weight": "much"}}, r"component 'web' \"weight\" must be a number > 0, got 'much'"),
    ({"web": "w*"}, r"component 'web': expected an object \{\"path\": ..., \"weight\": ...\}, got 'w\*'"),
])
def test_a_bad_mixture_file_is_refused_naming_the_value(tmp_path, base_keys, content, message):
    path = _write(tmp_path, content)
    with pytest.raises(dl.ConfigError, match=r"grain_train_mixture_config_path: .*" + message):
        parse_maxtext_config({**base_keys, "grain_train_mixture_config_path": path})


def test_a_mixture_file_with_weight_schedules_gives_one_weight_schedule(tmp_path):
    path = _write(tmp_path, {"web": {"path": "w*", "weight": [[0, 0.9], [1000, 0.6]]},
                             "books": {"path": "b*", "weight": 0.1},
                             "code": {"path": "c*", "weight": [[0, 0], [500, 0.2]]}})
    components = load_mixture_config(path)
    assert components[2] == ("web", "w*", ((0, 0.9), (1000, 0.6)))
    schedule = dl.maxtext.mixture_weights(components)
    assert isinstance(schedule, dl.WeightSchedule) and schedule.keys == ["books", "code", "web"]
    assert [at for at, _ in schedule.points] == [0, 500, 1000]
    assert schedule.weights_at(499) == pytest.approx([0.1, 0, 0.9])
    assert schedule.weights_at(500) == pytest.approx([0.1 / 1.2, 0.2 / 1.2, 0.9 / 1.2])
    assert schedule.weights_at(10**6) == pytest.approx([0.1 / 0.9, 0.2 / 0.9, 0.6 / 0.9])
    plain = load_mixture_config(_write(tmp_path, {"a": {"path": "a*", "weight": 2}}, "plain.json"))
    assert dl.maxtext.mixture_weights(plain) == {"a": 2.0}


@pytest.mark.parametrize(("weight", "message"), [
    ([[5, 1]], r"component 'web' \"weight\" points must start at 0 and increase, got \[\[5, 1\]\]"),
    ([[0, 1], [9, 2], [9, 3]], r"points must start at 0 and increase"),
    ([[0, -1]], r"\"weight\" point 0 must be \[at, weight\] with at an integer >= 0 and weight a number >= 0, got \[0, -1\]"),
    ([[0, 1, 2]], r"point 0 must be \[at, weight\]"),
    ([], r"\"weight\" is an empty list"),
    ([[0, 0], [10, 1]], r"do not make a schedule: WeightSchedule point 0 \(at 0\) has only zero weights"),
])
def test_a_bad_weight_schedule_in_a_mixture_file_is_refused(tmp_path, base_keys, weight, message):
    path = _write(tmp_path, {"web": {"path": "w*", "weight": weight}})
    with pytest.raises(dl.ConfigError, match=r"grain_train_mixture_config_path: .*" + message):
        parse_maxtext_config({**base_keys, "grain_train_mixture_config_path": path})


def test_a_missing_mixture_file_is_named(tmp_path, base_keys):
    with pytest.raises(dl.ConfigError, match=r"grain_train_mixture_config_path: the mixture file "
                                             r"'.*nothere.json' does not exist"):
        parse_maxtext_config({**base_keys, "grain_train_mixture_config_path": str(tmp_path / "nothere.json")})
