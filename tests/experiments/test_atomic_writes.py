"""One atomic writer: every file kiln writes whole is fsynced, renamed into place, and its
directory fsynced; a failed write leaves the old file and no temporary one."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from kiln.core import atomic
from kiln.core.atomic import atomic_write
from kiln.core.checkpoints.rundir import RunFile, read_run_file, write_run_file
from kiln.experiments.settings.job_files import write_job_json


@pytest.fixture
def synced(monkeypatch):
    """The paths ``os.fsync`` was called on, as the writers call it."""
    paths: list[Path] = []
    real = os.fsync

    def fsync(fd):
        paths.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    return paths


def _writers(tmp_path):
    """Each kind of file kiln writes whole, written by its own writer: (path, how)."""
    return [
        (tmp_path / "summary.json", lambda: write_job_json(tmp_path / "summary.json", {"a": 1})),
        (tmp_path / "run.json", lambda: write_run_file(tmp_path, RunFile("abc"))),
        (tmp_path / "rank-0.pkl", lambda: atomic_write(tmp_path / "rank-0.pkl", b"x")),
    ]


def test_every_writer_fsyncs_the_file_and_the_rename(tmp_path, synced):
    for path, write in _writers(tmp_path):
        synced.clear()
        write()
        assert path.is_file()
        (temp,) = [p for p in synced if p.parent == tmp_path and p != tmp_path]
        assert temp.name.startswith(f".{path.name}.") and temp.name.endswith(".tmp")
        assert synced[-1] == tmp_path, "the directory is fsynced after the rename"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-0.pkl", "run.json", "summary.json"]


def test_a_failed_write_keeps_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
    write_run_file(tmp_path, RunFile("old"))

    def full_disk(path, data):
        path.write_bytes(data[:3])  # part of it got out
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic, "write_synced", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_run_file(tmp_path, RunFile("new"))
    assert read_run_file(tmp_path).run_id == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]
    with pytest.raises(OSError):
        write_job_json(tmp_path / "summary.json", {"status": "ok"})
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_write_job_json_writes_strict_json(tmp_path):
    path = write_job_json(tmp_path / "deep" / "bench.json", {"x": float("nan"), "y": [1.5]})
    assert json.loads(path.read_text()) == {"x": None, "y": [1.5]}
