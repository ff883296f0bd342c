"""The ``mixture:`` section of a pipeline config: sources mixed by fixed weights or a
schedule, checked at load time, restoring exactly (also onto another host count)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dataloader as dl
from dataloader.config.mixture import component_seed
from dataloader.config.pipeline import ConfigError, parse_config
from tests.helpers import assert_restores_everywhere, assert_streams_equal

RANGE = "dataloader.sources.RangeDataSource"


def mixture(**section) -> dict:
    sources = {"web": {"kind": RANGE, "options": {"start": 0, "stop": 400}},
               "books": {"kind": RANGE, "options": {"start": 1000, "stop": 1400}}}
    return {"sources": sources, **section}


def config(mix: dict, *, shuffle=True, epochs=1, sharding="none", batch=8, overrides=()):
    data = {"mixture": mix, "sampler": {"shuffle": shuffle, "seed": 5, "num_epochs": epochs, "sharding": sharding},
            "operations": [{"batch": batch}]}
    return parse_config(data, overrides)


def books(batch) -> int:
    return int((np.asarray(batch) >= 1000).sum())


def test_fixed_weights_by_name_give_the_mapdataset_mixture_of_the_shuffled_sources():
    built = [b.tolist() for b in config(mixture(weights={"web": 3, "books": 1})).build_loader()]
    web = dl.MapDataset.source(dl.RangeDataSource(0, 400)).shuffle(seed=component_seed(5, 0))
    book = dl.MapDataset.source(dl.RangeDataSource(1000, 1400)).shuffle(seed=component_seed(5, 1))
    expected = dl.MapDataset.mix([web, book], [3, 1])
    flat = [x for b in built for x in b]
    assert flat == list(expected)[: len(flat)]
    assert sum(x >= 1000 for x in flat) * 4 == pytest.approx(len(flat), abs=4)


def test_a_step_schedule_switches_at_the_training_step_it_names():
    schedule = {"points": {0: {"web": 1, "books": 0}, 10: {"web": 1, "books": 1}, 20: {"web": 1, "books": 3}},
                "elements_per_step": 8}
    batches = _take(config(mixture(schedule=schedule), epochs=None), 30)
    assert [books(b) for b in batches[:10]] == [0] * 10
    assert [books(b) for b in batches[10:20]] == [4] * 10
    assert [books(b) for b in batches[20:30]] == [6] * 10


def _take(cfg, n):
    it = iter(cfg.build_loader())
    return [next(it) for _ in range(n)]


def test_a_linear_ramp_moves_the_shares_and_endless_sources_run_past_one_pass():
    schedule = {"points": [[0, {"web": 1, "books": 0}], [50, {"web": 0, "books": 1}]],
                "interpolation": "linear", "elements_per_step": 8, "ramp_pieces": 10}
    batches = _take(config(mixture(schedule=schedule), epochs=None), 120)  # 960 > 400 of a source
    counts = [books(b) for b in batches]
    assert sum(counts[:5]) < sum(counts[20:25]) < sum(counts[45:50])
    assert counts[60:] == [8] * 60  # the last point holds: books only, repeated past its 400


def test_a_scheduled_mixture_restores_at_every_step_around_a_switch():
    schedule = {"points": {0: {"web": 3, "books": 1}, 4: {"web": 1, "books": 2}}, "elements_per_step": 4}
    loader = config(mixture(schedule=schedule), batch=4).build_loader()
    assert_restores_everywhere(lambda: iter(loader), limit=12)


def test_an_elastic_restore_of_a_scheduled_mixture_from_two_hosts_to_three_reads_the_same_global_batches():
    schedule = {"points": {0: {"web": 3, "books": 1}, 3: {"web": 1, "books": 2}}, "elements_per_step": 12}

    def host(h, count):
        return config(mixture(schedule=schedule), batch=12 // count,
                      sharding={"shard_index": h, "shard_count": count}).build_loader()

    one = [x for b in _take(config(mixture(schedule=schedule), batch=12), 8) for x in b.tolist()]
    two = [iter(host(h, 2)) for h in range(2)]
    used = [x for it in two for _ in range(3) for x in next(it).tolist()]
    states = [json.loads(json.dumps(it.get_state())) for it in two]
    three = [host(h, 3).iterator(states) for h in range(3)]
    for _ in range(5):
        used += [x for it in three for x in next(it).tolist()]
    assert sorted(used) == sorted(one)  # the same 8 global batches, each record once


def test_the_same_batches_with_two_workers_as_with_none(tmp_path):
    schedule = {"points": {0: {"web": 1, "books": 1}, 5: {"web": 1, "books": 4}}, "elements_per_step": 8}
    in_process = _take(config(mixture(schedule=schedule)), 12)
    pooled = config(mixture(schedule=schedule), overrides=["loader.worker_count=2"]).build_loader()
    it = iter(pooled)
    try:
        assert_streams_equal(in_process, [next(it) for _ in range(12)])
    finally:
        it.close()


def test_a_yaml_mixture_with_overrides_of_one_weight(tmp_path):
    path = tmp_path / "mix.yaml"
    path.write_text(
        f"mixture:\n  sources:\n    web: {{kind: {RANGE}, options: {{start: 0, stop: 400}}}}\n"
        f"    books: {{kind: {RANGE}, options: {{start: 1000, stop: 1400}}}}\n"
        f"  weights: {{web: 1, books: 1}}\n"
        f"operations:\n  - batch: 8\n"
    )
    cfg = dl.load_config(str(path), ["mixture.weights.books=3"])
    assert cfg.mixture is not None and cfg.mixture.weights == [1.0, 3.0]
    plain = dl.MapDataset.mix([dl.MapDataset.range(0, 400), dl.MapDataset.range(1000, 1400)], [1, 3])
    assert sum(books(b) for b in cfg.build_loader()) == sum(x >= 1000 for x in plain) > 300  # at 1:3


@pytest.mark.parametrize(("section", "match"), [
    ({"weights": {"web": 1}}, r"mixture\.weights: expected one weight per source \(web, books\); missing \['books'\]"),
    ({"weights": {"web": 1, "books": -1}}, r"mixture\.weights\.books: expected a weight >= 0, got -1"),
    ({"weights": {"web": 0, "books": 0}}, r"mixture\.weights: every weight is 0"),
    ({"weights": {"web": "a", "books": 1}}, r"mixture\.weights\.web: expected a number, got 'a'"),
    ({"weights": {"web": 1, "books": 1}, "schedule": {"points": {0: {"web": 1, "books": 1}}}},
     r"mixture: give weights \(fixed\) or schedule \(changing\), not both"),
    ({"schedule": {"points": {5: {"web": 1, "books": 1}}}}, r"mixture\.schedule\.points: .*first point must be at 0"),
    ({"schedule": {"points": {0: {"web": 1, "books": 1}, 3: {"web": 1}}}},
     r"mixture\.schedule\.points\.3: expected one weight per source"),
    ({"schedule": {"points": {0: {"web": 1, "books": 1}}, "interpolation": "cubic"}},
     r"mixture\.schedule\.interpolation: expected one of step, linear, got 'cubic'"),
    ({"schedule": {"points": {0: {"web": 1, "books": 1}}, "elements_per_step": 0}},
     r"mixture\.schedule\.elements_per_step: expected an integer >= 1, got 0"),
    ({"schedule": {"points": "0: 1"}}, r"mixture\.schedule\.points: expected a mapping \{at:"),
    ({"schedule": {"every": 3, "points": {0: {"web": 1, "books": 1}}}}, r"mixture\.schedule\.every: unknown key"),
    ({"weight_by": "tokens"}, r"mixture\.weight_by: tokens needs each element's length .*IterDataset\.mix"),
    ({"weight_by": "bytes"}, r"mixture\.weight_by: expected one of elements, tokens, got 'bytes'"),
    ({"mix": 1}, r"mixture\.mix: unknown key; expected one of sources, weights, schedule, weight_by"),
])
def test_bad_mixture_sections_are_refused_at_load_time_naming_the_key(section, match):
    with pytest.raises(ConfigError, match=match):
        config(mixture(**section))


def test_a_source_of_the_mixture_is_checked_as_source_is_naming_its_key(tmp_path):
    mix = {"sources": {"web": {"kind": "array_record", "paths": str(tmp_path / "none-*.array_record")}}}
    with pytest.raises(ConfigError, match=r"mixture\.sources\.web\.paths: "):
        config(mix)
    with pytest.raises(ConfigError, match=r"mixture\.sources: expected a mapping of names to source sections"):
        config({"sources": [{"kind": RANGE}]})
    both = {"source": {"kind": RANGE, "options": {"start": 4}}, "mixture": mixture()}
    with pytest.raises(ConfigError, match=r"mixture: a config reads source: or mixture:, not both"):
        parse_config(both)


def test_an_override_of_a_schedule_point_writes_its_integer_key():
    schedule = {"points": {0: {"web": 1, "books": 0}, 10: {"web": 1, "books": 1}}, "elements_per_step": 8}
    cfg = config(mixture(schedule=schedule), overrides=["mixture.schedule.points.10.books=3"])
    assert isinstance(cfg.mixture.weights, dl.WeightSchedule)
    assert cfg.mixture.weights.points == [(0, [1.0, 0.0]), (10, [0.25, 0.75])]
    with pytest.raises(ConfigError, match=r"mixture\.schedule\.points\.10\.books: expected a weight >= 0, got -1"):
        config(mixture(schedule=schedule), overrides=["mixture.schedule.points.10.books=-1"])


def test_num_epochs_repeats_each_source_reshuffled_and_the_schedule_runs_on():
    data = [x for b in config(mixture(weights={"web": 1, "books": 1}), epochs=2).build_loader() for x in b.tolist()]
    web = [x for x in data if x < 1000]
    assert len(data) == 1600 and len(web) == 800  # two passes over each source, 1:1
    assert sorted(web[:400]) == sorted(web[400:]) == list(range(400))  # each pass: each record once
    assert web[:400] != web[400:]  # the second pass, reshuffled
