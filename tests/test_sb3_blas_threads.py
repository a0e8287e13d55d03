"""An SB3 run limits numpy's BLAS to its `torch_threads`, as it does torch's (algorithms/sb3/runner.py): BLAS's
default, a thread per core, made SAC+RRD's numpy reward model ~9x slower beside torch and a second worker
(benchmarks/sac_speed_levers.py)."""

from __future__ import annotations

import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from algorithms import train
from algorithms.sb3 import runner


def blas_threads() -> set[int]:
    return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}


@pytest.mark.parametrize("threads", [1, 2])
def test_building_a_run_sets_blas_threads_to_torch_threads(threads):
    if not blas_threads():
        pytest.skip("numpy is linked to no BLAS that threadpoolctl can see")
    spec = train.resolve_spec("ppo", "WatchRepair-v0", 0, {"torch_threads": threads})
    with threadpool_limits(None):  # restores the process's BLAS threads afterwards
        with threadpool_limits(3 - threads, user_api="blas"):  # start from the other value: the run must change it
            runner.build(spec, None)
            assert blas_threads() == {threads}
