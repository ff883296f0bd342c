"""The exchange through a key-value store that ``end="pad"`` agrees on (device/ends.py),
over a store in memory shared by threads (JAX's coordinator across processes)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from dataloader.device.ends import KeyValueExchange


class Store:
    """The three calls of JAX's distributed client that the exchange uses, in memory."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self._changed = threading.Condition()

    def key_value_set(self, key: str, value: str) -> None:
        with self._changed:
            assert key not in self.values, f"{key} written twice"
            self.values[key] = value
            self._changed.notify_all()

    def blocking_key_value_get(self, key: str, timeout_in_ms: int) -> str:
        with self._changed:
            if not self._changed.wait_for(lambda: key in self.values, timeout_in_ms / 1000):
                raise RuntimeError(f"DEADLINE_EXCEEDED: {key}")
            return self.values[key]

    def key_value_delete(self, key: str) -> None:
        with self._changed:
            del self.values[key]


def exchanges(store, hosts, **kw):
    return [KeyValueExchange(client=store, process_index=h, process_count=hosts, name="run", **kw)
            for h in range(hosts)]


def in_threads(calls):
    out: list = [None] * len(calls)

    def run(i):
        out[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    return out


def test_every_host_gets_every_host_s_values_in_host_order():
    store = Store()
    ex = exchanges(store, 3)
    for round_ in range(4):
        tables = in_threads([lambda h=h, r=round_: ex[h](np.array([h, r])) for h in range(3)])
        for table in tables:
            assert table.tolist() == [[0, round_], [1, round_], [2, round_]]


def test_a_host_deletes_its_key_two_rounds_later_when_everyone_has_read_it():
    store = Store()
    ex = exchanges(store, 2)
    for round_ in range(3):
        in_threads([lambda h=h, r=round_: ex[h](np.array([r])) for h in range(2)])
    rounds = sorted({key.split("/")[-2] for key in store.values})
    assert rounds == ["1", "2"]


def test_a_reset_starts_a_new_generation_that_never_reads_the_old_rounds():
    store = Store()
    ex = exchanges(store, 2)
    in_threads([lambda h=h: ex[h](np.array([7])) for h in range(2)])
    for e in ex:
        e.reset()
    tables = in_threads([lambda h=h: ex[h](np.array([h + 10])) for h in range(2)])
    assert tables[0].tolist() == [[10], [11]]
    assert {key.split("/")[1] for key in store.values} == {"0", "1"}  # run/<generation>/...


def test_one_process_exchanges_nothing():
    ex = KeyValueExchange(client=object(), process_index=0, process_count=1)
    assert ex(np.array([3, 1])).tolist() == [[3, 1]]


def test_a_host_that_never_answers_is_named_in_a_timeout():
    ex = exchanges(Store(), 2, timeout_s=0.05, poll_s=0.01)[0]
    with pytest.raises(TimeoutError, match=r"host 1 did not say within 0 s whether its data has ended"):
        ex(np.array([1, 0]))


def test_a_closed_exchange_stops_waiting():
    ex = exchanges(Store(), 2, poll_s=0.01)[0]
    ex.close()
    with pytest.raises(StopIteration):
        ex(np.array([1, 0]))


def test_other_errors_of_the_store_pass_through():
    class Broken(Store):
        def blocking_key_value_get(self, key, timeout_in_ms):
            raise RuntimeError("UNAVAILABLE: coordinator gone")

    with pytest.raises(RuntimeError, match="UNAVAILABLE"):
        exchanges(Broken(), 2)[0](np.array([1, 0]))


def test_end_together_pads_any_iterator_of_one_process():
    import dataloader as dl

    batches = iter([{"x": np.arange(4)}, {"x": np.arange(2)}])
    out = list(dl.end_together(batches, batch_size=4))
    assert [b["x"].tolist() for b in out] == [[0, 1, 2, 3], [0, 1, 0, 0]]
    assert [b["mask"].tolist() for b in out] == [[True] * 4, [True, True, False, False]]


def test_end_together_computes_the_steps_from_a_plain_batch_s_sampler():
    import dataloader as dl

    sampler = dl.IndexSampler(9, dl.ShardOptions(1, 2), num_epochs=1)  # 4 of 9: 1 batch of 4
    batches = iter([{"x": np.arange(4)}])
    out = list(dl.end_together(batches, batch_size=4, sampler=sampler))
    assert [b["mask"].tolist() for b in out] == [[True] * 4, [False] * 4]  # host 0 has 2 batches
    with pytest.raises(ValueError, match='end_together needs end="pad"'):
        dl.end_together(iter([]), batch_size=4, end=None)
