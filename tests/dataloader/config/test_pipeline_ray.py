"""``loader.ray`` in a pipeline config: every key checked when the config is read, with
no Ray needed (the cluster is joined when the loader is built; that is tested on a real
cluster in tests/integration/test_ray_executor.py)."""

from __future__ import annotations

import pytest

from dataloader.config.pipeline import ConfigError, parse_config

SOURCE = {"kind": "dataloader.sources.RangeDataSource", "options": {"start": 4}}


def test_every_ray_executor_setting_is_a_key_and_overrides_reach_it():
    section = {"address": "auto", "num_workers": 8, "local_workers": 1, "num_cpus_per_worker": 2,
               "resources": {"data": 1}, "units_per_worker": 3, "start_timeout_s": 30,
               "stall_warning_s": 20, "unit_timeout_s": 60}
    config = parse_config({"source": SOURCE, "loader": {"ray": section}})
    assert config.loader.ray == section
    config = parse_config({"source": SOURCE}, ["loader.ray.unit_timeout_s=45", "loader.ray.num_workers=4"])
    assert config.loader.ray == {"unit_timeout_s": 45, "num_workers": 4}


@pytest.mark.parametrize(("section", "match"), [
    ({"ray": {"num_workers": 0}}, r"loader\.ray\.num_workers: expected at least one actor"),
    ({"ray": {"local_workers": -1}}, r"loader\.ray\.local_workers: expected an integer >= 0, got -1"),
    ({"ray": {"adress": "auto"}}, r"loader\.ray\.adress: unknown key"),
    ({"worker_count": 2, "ray": {}}, r"loader\.ray: computes the units: set loader\.worker_count to 0"),
    ({"ray": {"unit_timeout_s": 0}}, r"loader\.ray\.unit_timeout_s: expected a number > 0, got 0"),
    ({"ray": {"unit_timeout_s": "soon"}}, r"loader\.ray\.unit_timeout_s: expected a number, got 'soon'"),
    ({"unit_timeout_s": 5, "ray": {}}, r"loader\.unit_timeout_s: .* set loader\.ray\.unit_timeout_s instead"),
])
def test_a_bad_ray_section_is_named(section, match):
    with pytest.raises(ConfigError, match=match):
        parse_config({"source": SOURCE, "loader": section})
