"""Digests of records and outputs: content, kind and shape, the same in every process."""

from __future__ import annotations

import numpy as np
import pytest

from dataloader.engine.digest import digest


def test_digests_tell_kinds_and_contents_apart():
    assert digest(b"1") != digest("1") != digest(1)
    assert digest({"a": np.arange(3)}) == digest({"a": np.arange(3)})
    assert digest(np.arange(3, dtype=np.int32)) != digest(np.arange(3))
    assert digest({"b", "a"}) == digest({"a", "b"})
    days = np.array(["2020-01-01", "2020-01-02"], dtype="M8[D]")  # no buffer format: by its bytes
    assert digest(days) != digest(days[::-1].copy())
    assert digest(np.arange(6).reshape(2, 3).T) == digest(np.arange(6).reshape(2, 3).T.copy())


# Digests of version 1 (FINGERPRINT_VERSION) as first written: a state saved by an
# earlier release carries these, and a restore compares them with what it reads now.
VERSION_1_DIGESTS = [
    (b"1", 0x2C400FFE1B5B170),
    ("1", 0x30801100910818A),
    (1, 0x8580226E849749F),
    (2.5, 0x14D603554D56C7C1),
    (np.int64(7), 0x168F01D108BBDDE4),
    (np.float32(0.25), 0x103202816B6E39C9),
    (np.bool_(True), 0xB4501FD8B62EE25),
    (np.datetime64("2020-01-01"), 0x29BF0347764C4602),
    (np.arange(3), 0x401D022C550CD25C),
    (np.array(["a", "bb"], dtype=object), 0x1DCB041B39AAF965),
    ({"id": np.int64(0), "text": "hello", "label": np.int64(3)}, 0xA8EA0E91A810EAEF),
    ({"b": 1, "a": [1, "x", b"y"]}, 0xBDE70B0F57BCD51E),
    ({1: "a", "1": b"a"}, 0x452B0672C5E6210A),
    ({"it's": 1, "a": 2}, 0x741A08B31A8DBEA4),
    ({"s": {"a", "b"}}, 0x761B08B7E9162E41),
    ({"arr": np.ones((2, 2), dtype=np.float32), "t": ("é", None)}, 0x84C124415553015),
]


@pytest.mark.parametrize(("obj", "value"), VERSION_1_DIGESTS, ids=[repr(o)[:30] for o, _ in VERSION_1_DIGESTS])
def test_digests_keep_their_version_1_values(obj, value):
    """The digest is computed faster (small pieces hashed joined, dict key orders and
    numpy scalar headers kept) but over the same bytes: twice, so that what is kept for
    a second record of the same kind is used."""
    assert digest(obj) == value
    assert digest(obj) == value


def test_dicts_with_the_same_keys_in_another_order_have_one_digest():
    first, second = {"b": 1, "a": np.int64(2)}, {"a": np.int64(2), "b": 1}
    assert digest(first) == digest(second) == digest(dict(first))
    assert digest({"a": np.int64(2), "b": 2}) != digest(second)
    assert digest({"a": np.int32(2), "b": 1}) != digest(second)  # the scalar's dtype counts
