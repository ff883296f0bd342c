"""Inputs and output on a Beam file system other than the local one (as ``gs://`` on
Dataflow): read through ``FileSystems``, shards written locally and copied, renamed by
the file system. ``granarytest://`` is a real Beam ``FileSystem`` (registered by
subclassing, as Beam's own are) that keeps its files under a local folder."""

from __future__ import annotations

import json
import os

import pytest
from apache_beam.io.filesystem import FileMetadata
from apache_beam.io.localfilesystem import LocalFileSystem

import dataloader as dl
from dataloader.beam import convert
from dataloader.errors import ConvertError

SCHEME = "granarytest"


def local(path: str) -> str:
    return path[len(SCHEME) + 3:] if path.startswith(SCHEME + "://") else path


def remote(path: str) -> str:
    return f"{SCHEME}://{path}"


class MappedFileSystem(LocalFileSystem):
    """``granarytest:///abs/path`` is the local file ``/abs/path``."""

    @classmethod
    def scheme(cls):
        return SCHEME

    def _list(self, dir_or_prefix):
        for meta in super()._list(local(dir_or_prefix)):
            yield FileMetadata(remote(meta.path), meta.size_in_bytes, meta.last_updated_in_seconds)

    def _path_open(self, path, *args, **kwargs):
        return super()._path_open(local(path), *args, **kwargs)

    def create(self, path, *args, **kwargs):
        return super().create(local(path), *args, **kwargs)

    def mkdirs(self, path):
        return super().mkdirs(local(path))

    def exists(self, path):
        return super().exists(local(path))

    def size(self, path):
        return super().size(local(path))

    def metadata(self, path):
        meta = super().metadata(local(path))
        return FileMetadata(path, meta.size_in_bytes, meta.last_updated_in_seconds)

    def copy(self, sources, destinations):
        return super().copy([local(p) for p in sources], [local(p) for p in destinations])

    def rename(self, sources, destinations):
        return super().rename([local(p) for p in sources], [local(p) for p in destinations])

    def delete(self, paths):
        return super().delete([local(p) for p in paths])


def test_remote_inputs_and_output_convert_whole_and_refuse_a_rerun(tmp_path):
    for k in range(2):
        (tmp_path / f"in-{k}.jsonl").write_text("".join(f'{{"i": {k * 10 + i}}}\n' for i in range(10)))
    inputs = [remote(str(tmp_path / "in-*.jsonl"))]
    prefix = remote(str(tmp_path / "out" / "x"))
    result = convert(inputs, prefix, num_shards=3, progress=False)
    assert result.paths == [f"{prefix}-0000{s}-of-00003.array_record" for s in range(3)]
    assert sorted(os.listdir(tmp_path / "out")) == [f"x-0000{s}-of-00003.array_record" for s in range(3)]
    source = dl.ArrayRecordDataSource([local(p) for p in result.paths])
    assert [json.loads(source[i])["i"] for i in range(len(source))] == list(range(20))
    with pytest.raises(ConvertError, match=r"the output already exists \(granarytest://.*x-00000-of-00003"):
        convert(inputs, prefix, num_shards=2, progress=False)
    matched = convert(inputs, remote(str(tmp_path / "out" / "m")), match_shards=True, progress=False)
    assert [os.path.basename(p) for p in matched.paths] == ["m-in-0.array_record", "m-in-1.array_record"]
    assert [s.count for s in matched.shards] == [10, 10]
