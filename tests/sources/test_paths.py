"""Tests for the expansion of paths, globs and lists of them."""

from __future__ import annotations

import pytest

from dataloader.sources import expand_paths
from dataloader.sources.files.paths import format_paths


def _expand(paths):
    return expand_paths(paths, what="Test", example_glob="*.t")


def test_glob_matches_are_sorted_and_list_order_kept(tmp_path):
    for name in ["b.t", "a.t", "c.t", "z.u"]:
        (tmp_path / name).write_bytes(b"x")
    files = _expand([str(tmp_path / "z.u"), tmp_path / "*.t"])
    assert files == [str(tmp_path / n) for n in ["z.u", "a.t", "b.t", "c.t"]]


def test_existing_path_with_glob_characters_is_taken_literally(tmp_path):
    path = tmp_path / "data[1].t"
    path.write_bytes(b"x")
    assert _expand(path) == [str(path)]


def test_directory_is_refused_with_a_glob_suggestion(tmp_path):
    with pytest.raises(ValueError, match=r"is a directory, expected a Test file; pass a glob"):
        _expand(tmp_path)


def test_non_path_is_refused():
    with pytest.raises(TypeError, match="paths must be a path, a glob pattern or a list"):
        _expand(3)


def test_non_path_element_is_refused(tmp_path):
    with pytest.raises(TypeError, match=r"each path must be a str or os.PathLike, got int 7"):
        _expand([7])


def test_format_paths_abbreviates_long_lists():
    assert format_paths(["a", "b"]) == "['a', 'b']"
    assert format_paths([str(i) for i in range(10)]) == "['0', '1', ... 7 more ..., '9']"
