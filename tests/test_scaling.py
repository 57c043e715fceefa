"""The scaling estimate (`kerascale.plan.scaling`): a ring all-reduce after
each update, amortized by accumulation; the check against runs measured
here is benchmarks/scaling.py."""

import pytest

from kerascale.plan import scaling


def test_one_worker_is_the_measured_step():
    one = scaling.estimate(0.1, 32, 10**8, 1)
    assert one.step_seconds == 0.1 and one.allreduce_seconds == 0.0
    assert one.samples_per_second == pytest.approx(320)


def test_a_ring_all_reduce_sends_2_n_minus_1_over_n_of_the_bytes_each_way():
    # 100 MB over 4 workers at 10 GB/s and no latency: 2*3/4 * 0.01 s
    t = scaling.allreduce_seconds(10**8, 4, 10e9, 0.0)
    assert t == pytest.approx(0.015)
    # latency: 2 (N - 1) hops
    assert scaling.allreduce_seconds(0, 4, 10e9, 1e-3) == pytest.approx(6e-3)


def test_more_workers_add_throughput_until_the_all_reduce_dominates():
    rows = scaling.table(0.05, 64, 4 * 10**8, [1, 2, 8], kind="network")
    assert rows[0].samples_per_second < rows[1].samples_per_second
    assert rows[2].allreduce_seconds > rows[2].step_seconds - 0.05 - 1e-12
    # 400 MB at 12.5 GB/s: the 8-worker step is mostly communication
    assert rows[2].allreduce_seconds > 0.05


def test_accumulation_runs_the_all_reduce_once_per_update():
    plain = scaling.estimate(0.05, 64, 4 * 10**8, 8)
    four = scaling.estimate(0.05, 64, 4 * 10**8, 8, accumulation=4)
    assert four.allreduce_seconds == plain.allreduce_seconds
    assert four.step_seconds == pytest.approx(4 * 0.05 + plain.allreduce_seconds)
    assert four.samples_per_second > plain.samples_per_second


def test_workers_that_share_one_machine_s_cores_add_no_compute():
    shared = scaling.estimate(0.05, 64, 0, 4, shared_compute=True, latency=0.0)
    assert shared.step_seconds == pytest.approx(0.2)
    assert shared.samples_per_second == pytest.approx(64 / 0.05)


def test_a_given_bandwidth_replaces_the_link_s():
    fast = scaling.estimate(0.05, 64, 10**9, 2, bandwidth=1e12, latency=0.0)
    assert fast.allreduce_seconds == pytest.approx(1e-3)
