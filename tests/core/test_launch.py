import os

import launch_workers
import pytest

from kiln.core.distributed.launch import WorkerFailedError, launch
from kiln.core.distributed.threads import default_threads_per_rank


def _in_process(x: int) -> tuple[int, int]:
    return x, __import__("os").getpid()


@pytest.mark.slow
def test_two_ddp_workers_all_reduce_and_return_in_rank_order(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # as in a shell that never set it
    results = launch(launch_workers.ddp_all_reduce, 2, "hello")
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world_size"] == 2 for r in results)
    assert all(r["sum"] == 3.0 for r in results)  # 1 + 2
    assert all(r["tag"] == "hello" for r in results)
    # each worker starts with its share of the cores it may use, as torchrun gives it
    share = str(default_threads_per_rank(2, 1))
    assert [r["threads"] for r in results] == [share, share]
    assert "OMP_NUM_THREADS" not in os.environ  # the parent's environment is left as it was


@pytest.mark.slow
def test_failing_worker_raises_with_its_error_and_traceback():
    with pytest.raises(WorkerFailedError) as error:
        launch(launch_workers.fail_on_rank_one, 2, "tag-7")
    message = str(error.value)
    assert "worker rank 1" in message
    assert "ValueError: worker says no (tag-7)" in message
    assert "launch_workers.py" in message  # the traceback


def test_single_process_runs_in_process():
    assert launch(_in_process, 1, 5) == [(5, os.getpid())]


def test_under_an_external_launcher_runs_in_process(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert launch(_in_process, 2, 1) == [(1, os.getpid())]


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="nprocs=0"):
        launch(_in_process, 0)
    with pytest.raises(ValueError, match="lambda or defined inside a function"):
        launch(lambda: 1, 2)
