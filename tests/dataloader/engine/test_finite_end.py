"""``end="pad"``: every host runs the same number of steps over finite data, with the
last batches padded and masked (dataloader/engine/stages/finite.py).

Hosts are simulated in one process with ``ShardOptions``; where they must agree (a
filter, flat map, packer or mixture), each host runs in a thread and the exchange is a
barrier between them, which is what JAX's key-value store gives across processes.
"""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

import dataloader as dl
from dataloader.engine.restore.protocol import takes_every_host
from dataloader.engine.stages.finite import (
    PadEnd,
    batch_count,
    pad_batch,
    resolve_end,
    spec_of,
    static_steps,
    zeros_of,
)


class Hosts:
    """An all-gather between ``count`` threads: every call returns every host's values."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._barrier = threading.Barrier(count, timeout=30)
        self._rows: list = [None] * count
        self.calls = [0] * count

    def exchange(self, host: int):
        def call(values):
            self.calls[host] += 1
            self._rows[host] = np.asarray(values)
            self._barrier.wait()
            out = np.stack(self._rows)
            self._barrier.wait()  # nobody overwrites a row before everyone has read it
            return out
        return call

    def run(self, job):
        """``job(host)`` in one thread per host; their results, by host."""
        results: list = [None] * self.count
        errors: list = []

        def target(h):
            try:
                results[h] = job(h)
            except BaseException as exc:  # reported below, in the test's thread
                errors.append(exc)
                self._barrier.abort()

        threads = [threading.Thread(target=target, args=(h,)) for h in range(self.count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a host never finished"
        if errors:
            raise errors[0]
        return results


def as_dict(x):
    return {"x": np.int64(x), "pair": np.array([x, -x], np.int64)}


def keep(d):
    # Survival differs per host: without a shuffle shard h reads x = h mod H, and keeps
    # different shares of them: 19 and 11 records of 50 for H = 2, 7, 17 and 6 for H = 3.
    x = int(d["x"])
    return x % 4 == 0 or x % 3 == 1 or x < 8


def loader(host, hosts, ops, n=50, end="pad", epochs=1, shard_drop=False, exchange=None, **kw):
    if exchange is not None:
        end = PadEnd(lookahead=kw.pop("lookahead", 8), exchange=lambda: exchange)
    return dl.DataLoader(
        dl.RangeDataSource(n),
        dl.IndexSampler(n, dl.ShardOptions(host, hosts, drop_remainder=shard_drop),
                        shuffle=False, num_epochs=epochs),
        ops, end=end, **kw)


def rows(batches):
    """The unmasked records of a host's batches, and a check of the padding rows."""
    out = []
    for b in batches:
        mask = b["mask"]
        assert mask.dtype == bool and mask.shape == (b["x"].shape[0],)
        assert not b["x"][~mask].any() and not b["pair"][~mask].any(), "padding rows are not zero"
        out += b["x"][mask].tolist()
    return out


# --- the step count, computed -------------------------------------------------------


@pytest.mark.parametrize(("n", "hosts", "batch", "shard_drop", "batch_drop"), [
    (n, h, b, sd, bd) for n, h, b, sd, bd in itertools.product(
        [0, 1, 7, 12, 13, 50], [1, 2, 3, 5], [1, 4, 5], [False, True], [False, True])
])
def test_static_steps_match_what_each_host_reads(n, hosts, batch, shard_drop, batch_drop):
    counts = []
    for h in range(hosts):
        sampler = dl.IndexSampler(n, dl.ShardOptions(h, hosts, drop_remainder=shard_drop),
                                  num_epochs=2) if n else None
        if sampler is None:
            counts.append(0)
            continue
        plain = dl.DataLoader(dl.RangeDataSource(n), sampler, [dl.Batch(batch, drop_remainder=batch_drop)])
        counts.append(sum(1 for _ in plain))
        own, total = static_steps(sampler, batch, batch_drop)
        assert own == counts[-1]
    if n:
        assert total == max(counts)


def test_static_steps_are_none_for_an_infinite_stream():
    assert static_steps(dl.IndexSampler(10, num_epochs=None), 4, False) is None
    assert static_steps(object(), 4, False) is None
    assert batch_count(9, 4, False) == 3 and batch_count(9, 4, True) == 2


# --- padding and the mask ---------------------------------------------------------


def test_a_short_batch_is_padded_with_zero_rows_and_masked():
    out = pad_batch({"x": np.array([5, 6]), "n": {"y": np.ones((2, 3), np.float32)}}, 4, "mask")
    assert out["x"].tolist() == [5, 6, 0, 0]
    assert out["n"]["y"].shape == (4, 3) and out["n"]["y"][2:].sum() == 0 and out["n"]["y"].dtype == np.float32
    assert out["mask"].tolist() == [True, True, False, False]


def test_padding_is_shaped_by_the_spec_which_is_json():
    spec = spec_of({"x": np.zeros((4, 2), np.int32), "n": {"y": np.zeros(4, np.float16)}})
    assert spec == {"x": ["<i4", [4, 2]], "n": {"y": ["<f2", [4]]}}
    zeros = zeros_of(spec)
    assert zeros["x"].dtype == np.int32 and zeros["x"].shape == (4, 2) and zeros["n"]["y"].dtype == np.float16


@pytest.mark.parametrize(("batch", "error", "match"), [
    (np.arange(3), TypeError, "needs batches that are dicts"),
    ({"mask": np.arange(3)}, ValueError, "already has a field 'mask'"),
    ({"x": np.arange(5)}, ValueError, "5 rows is larger than the batch size 4"),
])
def test_pad_batch_refuses_what_it_cannot_pad(batch, error, match):
    with pytest.raises(error, match=match):
        pad_batch(batch, 4, "mask")


@pytest.mark.parametrize(("end", "match"), [
    ("stop", 'end must be None, "pad" or a dl.PadEnd'),
    (PadEnd, 'end must be None, "pad"'),
])
def test_a_bad_end_is_refused(end, match):
    with pytest.raises(ValueError, match=match):
        resolve_end(end)


def test_pad_end_checks_its_fields():
    with pytest.raises(ValueError, match="lookahead must be an integer >= 1, got 0"):
        PadEnd(lookahead=0)
    with pytest.raises(ValueError, match="mask_key must be a non-empty string"):
        PadEnd(mask_key="")


def test_end_pad_needs_a_batch():
    with pytest.raises(ValueError, match='end="pad" pads the last batches, and the operations have no Batch'):
        loader(0, 1, [dl.MapTransform(as_dict)])


def test_without_end_a_loader_is_as_before():
    plain = [b.tolist() for b in loader(0, 1, [dl.Batch(4)], end=None)]
    assert plain[-1] == plain[-1][:2] and len(plain) == 13  # 50 = 12 * 4 + 2: short last batch


# --- a plain batch: computed, no exchange ----------------------------------------------


@pytest.mark.parametrize("hosts", [1, 2, 3, 4])
@pytest.mark.parametrize("batch_drop", [False, True])
def test_plain_batch_hosts_run_the_same_steps_without_exchanging(hosts, batch_drop):
    ops = [dl.MapTransform(as_dict), dl.Batch(4, drop_remainder=batch_drop)]
    runs = [list(loader(h, hosts, ops, n=50)) for h in range(hosts)]
    assert len({len(r) for r in runs}) == 1
    seen = sorted(x for r in runs for x in rows(r))
    per_host = [sum(1 for _ in loader(h, hosts, ops, n=50, end=None)) for h in range(hosts)]
    assert len(runs[0]) == max(per_host)
    if batch_drop:  # asked for: whole batches only, so a host's short last batch goes
        dropped = [len(range(h, 50, hosts)) % 4 for h in range(hosts)]
        assert len(seen) == 50 - sum(dropped)
    else:
        assert seen == list(range(50))
    assert all(b["x"].shape == (4,) for r in runs for b in r)


# --- agreed: filter, flat map, packer, mixture --------------------------------------


def run_agreed(hosts, ops, lookahead, n=50, epochs=1):
    group = Hosts(hosts)
    runs = group.run(lambda h: list(loader(h, hosts, ops, n=n, epochs=epochs,
                                           exchange=group.exchange(h), lookahead=lookahead)))
    return runs, group


@pytest.mark.parametrize("hosts", [2, 3])
@pytest.mark.parametrize("lookahead", [1, 2, 5])
def test_filtered_hosts_run_the_same_steps_and_every_record_appears_once(hosts, lookahead):
    ops = [dl.MapTransform(as_dict), dl.FilterTransform(keep), dl.Batch(4)]
    runs, group = run_agreed(hosts, ops, lookahead)
    alone = [list(loader(h, hosts, ops, end=None)) for h in range(hosts)]
    assert len({len(a) for a in alone}) > 1, "the test needs hosts with different batch counts"
    assert {len(r) for r in runs} == {max(len(a) for a in alone)}
    for r, a in zip(runs, alone, strict=True):
        assert rows(r) == [x for b in a for x in b["x"].tolist()]  # same order, nothing lost
    assert sorted(x for r in runs for x in rows(r)) == [x for x in range(50) if keep({"x": x})]
    steps = len(runs[0])
    # One exchange per lookahead steps, and one to learn that everyone has ended.
    assert group.calls[0] <= -(-steps // lookahead) + 2
    assert len(set(group.calls)) == 1


def test_flat_map_hosts_end_together():
    class Repeat(dl.FlatMapTransform):
        max_fan_out = 3

        def flat_map(self, x):
            return [as_dict(x)] * (int(x) % 4 if int(x) % 5 else 0)

    runs, _ = run_agreed(3, [Repeat(), dl.Batch(4)], lookahead=3)
    assert len({len(r) for r in runs}) == 1
    expected = sorted(x for x in range(50) for _ in range(x % 4 if x % 5 else 0))
    assert sorted(x for r in runs for x in rows(r)) == expected


def tokens(x):
    return {"tokens": np.arange(1, 2 + int(x) % 6, dtype=np.int32)}


@pytest.mark.parametrize("packer", [
    lambda: dl.FirstFitPack({"tokens": 8}, num_packing_bins=2),
    lambda: dl.BestFitPack({"tokens": 8}, num_packing_bins=2),
    lambda: dl.ConcatThenSplit({"tokens": 8}),
])
def test_packed_hosts_end_together(packer):
    hosts = 3
    ops = [dl.FilterTransform(lambda x: x % 4 != (x % 3)), dl.MapTransform(tokens), packer(), dl.Batch(2)]
    group = Hosts(hosts)
    runs = group.run(lambda h: list(loader(h, hosts, ops, exchange=group.exchange(h), lookahead=2)))
    alone = [list(loader(h, hosts, ops, end=None)) for h in range(hosts)]
    assert {len(r) for r in runs} == {max(len(a) for a in alone)}
    for r, a in zip(runs, alone, strict=True):
        real = [row for b in r for row in b["tokens"][b["mask"]].tolist()]
        assert real == [row for b in a for row in b["tokens"].tolist()]
        for b in r:
            assert not b["tokens"][~b["mask"]].any() and not b["tokens_segment_ids"][~b["mask"]].any()


def test_a_mixture_ends_together_through_end_together():
    from dataloader.engine.stages.finite import EndTogether

    hosts = 2
    group = Hosts(hosts)

    def batches(h):  # host 1 mixes longer parts than host 0
        parts = [dl.MapDataset.range(0, 20 + 30 * h).filter(lambda x: x % 2 == 0),
                 dl.MapDataset.range(100, 110 + 30 * h)]
        mixed = dl.IterDataset.mix([p.to_iter_dataset() for p in parts], [0.5, 0.5])
        return iter(mixed.map(lambda x: {"x": np.int64(x), "pair": np.array([x, -x])}).batch(4))

    def host(h):
        return list(EndTogether(batches(h), batch_size=4, end=PadEnd(lookahead=2),
                                exchange=group.exchange(h)))

    runs = group.run(host)
    alone = [[x for b in batches(h) for x in b["x"].tolist()] for h in range(hosts)]
    assert len(alone[0]) < len(alone[1])
    assert len(runs[0]) == len(runs[1]) == -(-len(alone[1]) // 4)
    assert [rows(r) for r in runs] == alone
    assert not runs[0][-1]["mask"].any(), "host 0 has less data: its last batches are padding"


def test_a_host_without_any_batch_needs_an_example():
    hosts = Hosts(2)
    ops = [dl.MapTransform(as_dict), dl.FilterTransform(lambda d: int(d["x"]) % 2 == 0), dl.Batch(2)]

    def host(h):  # host 1 reads the odd positions: all filtered out (no shuffle)
        sampler = dl.IndexSampler(10, dl.ShardOptions(h, 2), num_epochs=1)
        end = PadEnd(exchange=lambda: hosts.exchange(h), example=as_dict_batch() if h else None)
        return [b["mask"].tolist() for b in dl.DataLoader(dl.RangeDataSource(10), sampler, ops, end=end)]

    runs = hosts.run(host)
    assert runs[1] == [[False, False]] * 3 and runs[0][-1] == [True, False]
    bare = Hosts(2)

    def without(h):
        sampler = dl.IndexSampler(10, dl.ShardOptions(h, 2), num_epochs=1)
        return list(dl.DataLoader(dl.RangeDataSource(10), sampler, ops,
                                  end=PadEnd(exchange=lambda: bare.exchange(h))))

    with pytest.raises(ValueError, match=r"no batch of its own .*dl\.PadEnd\(example=<a batch>\)"):
        bare.run(without)


def as_dict_batch():
    return {"x": np.zeros(2, np.int64), "pair": np.zeros((2, 2), np.int64)}


# --- the state ---------------------------------------------------------------------


def outputs(batches):
    return [(b["x"].tolist(), b["mask"].tolist()) for b in batches]


@pytest.mark.parametrize("ops", [
    [dl.MapTransform(as_dict), dl.Batch(4)],
    [dl.MapTransform(as_dict), dl.FilterTransform(keep), dl.Batch(4)],
], ids=["plain", "filter"])
def test_a_restore_at_every_step_continues_the_same_stream_padded_tail_included(ops):
    hosts = 3
    group = Hosts(hosts)
    runs = group.run(lambda h: _states_and_outputs(h, hosts, ops, group.exchange(h)))
    steps = len(runs[0][1])
    assert any(not b[1][-1] for b in runs[-1][1]), "the run needs a padded tail on the last host"
    for k in range(steps + 1):
        again = Hosts(hosts)

        def restored(h, k=k, again=again):
            it = loader(h, hosts, ops, exchange=again.exchange(h), lookahead=2).iterator(runs[h][0][k])
            return outputs(it)

        for h, rest in enumerate(again.run(restored)):
            assert rest == runs[h][1][k:], f"host {h}, restored after step {k}"


def _states_and_outputs(h, hosts, ops, exchange):
    it = loader(h, hosts, ops, exchange=exchange, lookahead=2).iterator()
    states, out = [it.get_state()], []
    for b in it:
        out.append((b["x"].tolist(), b["mask"].tolist()))
        states.append(it.get_state())
    assert all(len(repr(s)) < 2000 for s in states)
    return states, out


# --- configs -----------------------------------------------------------------------


def config(end):
    return {
        "source": {"kind": "dataloader.sources.RangeDataSource", "options": {"start": 9}},
        "sampler": {"num_epochs": 1, "sharding": {"shard_index": 1, "shard_count": 2}},
        "operations": [{"map": "tests.dataloader.engine.test_finite_end.as_dict"}, {"batch": {"batch_size": 4}}],
        "loader": {"end": end},
    }


@pytest.mark.parametrize("end", ["pad", {"lookahead": 2, "mask_key": "real"}])
def test_a_config_pads_the_end_with_loader_end(end):
    from dataloader.config import parse_config

    loader = parse_config(config(end)).build_loader()
    key = "mask" if end == "pad" else "real"
    assert [b[key].tolist() for b in loader] == [[True] * 4, [False] * 4]
    assert loader.end == (PadEnd() if end == "pad" else PadEnd(lookahead=2, mask_key="real"))


@pytest.mark.parametrize(("end", "match"), [
    ("stop", "loader.end: expected null, pad or a mapping"),
    ({"lookahead": 0}, "loader.end: PadEnd.lookahead must be an integer >= 1, got 0"),
    ({"look": 2}, "loader.end"),
])
def test_a_config_with_a_bad_end_names_the_key(end, match):
    from dataloader.config import parse_config

    with pytest.raises(dl.ConfigError, match=match):
        parse_config(config(end))


def test_a_config_without_end_keeps_the_short_last_batch():
    from dataloader.config import parse_config

    loader = parse_config(config(None)).build_loader()
    assert [b["x"].tolist() for b in loader] == [[1, 3, 5, 7]]


def test_worker_processes_give_the_same_padded_steps():
    ops = [dl.MapTransform(as_dict), dl.FilterTransform(keep), dl.Batch(4)]
    runs, _ = run_agreed(2, ops, lookahead=3)
    group = Hosts(2)

    def host(h):
        it = loader(h, 2, ops, exchange=group.exchange(h), lookahead=3, worker_count=1).iterator()
        try:
            return outputs(it)
        finally:
            it.close()

    assert group.run(host) == [outputs(r) for r in runs]


# --- elastic restore (another host count) -------------------------------------------


@pytest.mark.parametrize("ops", [
    [dl.MapTransform(as_dict), dl.Batch(4)],
    [dl.MapTransform(as_dict), dl.FilterTransform(keep), dl.Batch(4)],
], ids=["plain", "filter"])
@pytest.mark.parametrize(("old", "new"), [(3, 2), (2, 3)])
def test_an_elastic_restore_at_every_step_ends_together_and_uses_each_record_once(ops, old, new):
    """Every old host's states at step k (padded tails included) restore on another host
    count: the new hosts run the same number of steps, and the records before and after
    the change are the stream's, each once."""
    group = Hosts(old)
    runs = group.run(lambda h: _states_and_outputs(h, old, ops, group.exchange(h)))
    assert any(not b[1][-1] for r in runs for b in r[1]), "the run needs a padded tail"
    want = sorted(x for x in range(50) if keep({"x": x}) or len(ops) == 2)
    for k in range(len(runs[0][1]) + 1):
        states = [runs[h][0][k] for h in range(old)]
        before = [x for h in range(old) for xs, mask in runs[h][1][:k] for x, m in zip(xs, mask) if m]
        again = Hosts(new)

        def restored(h, states=states, again=again):
            it = loader(h, new, ops, exchange=again.exchange(h), lookahead=2).iterator(states)
            return list(it)

        after = again.run(restored)
        assert len({len(r) for r in after}) == 1, f"after step {k}: the new hosts stop on different steps"
        assert sorted(before + [x for r in after for x in rows(r)]) == want, f"restored after step {k}"


def test_an_elastic_restore_after_every_old_host_ended_stops_at_once():
    """Every old host at its stream's end: the new hosts have no batch of their own, and
    stop at once (no padding needed), whatever the host count."""
    ops = [dl.MapTransform(as_dict), dl.FilterTransform(keep), dl.Batch(4)]
    group = Hosts(2)
    runs = group.run(lambda h: _states_and_outputs(h, 2, ops, group.exchange(h)))
    states = [runs[h][0][-1] for h in range(2)]
    again = Hosts(3)
    after = again.run(lambda h: list(loader(h, 3, ops, exchange=again.exchange(h)).iterator(states)))
    assert after == [[], [], []]


def test_an_end_together_over_an_iterator_of_one_state_refuses_every_hosts_states():
    from dataloader.engine.stages.finite import EndTogether
    from dataloader.errors import StateMismatchError

    class One:
        def __iter__(self):
            return self

        def __next__(self):
            raise StopIteration

        def get_state(self):
            return {}

        def set_state(self, state):
            pass

    it = EndTogether(One(), batch_size=2, end=PadEnd())
    assert not takes_every_host(it)
    with pytest.raises(StateMismatchError, match="restores from one state only"):
        it.set_state([{}, {}])


def test_an_end_pad_loaders_iterator_takes_every_shard_in_an_orbax_restore():
    it = loader(0, 2, [dl.MapTransform(as_dict), dl.Batch(4)]).iterator()
    assert takes_every_host(it)
