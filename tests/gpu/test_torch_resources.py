"""A policy's compute resources (shimrt.torch.resources), as overlap() and bench torch hold them:
each partition and Interposer made once; bench's closed with it, overlap()'s kept for the process."""

from __future__ import annotations

import pytest

from shimrt import ShimrtError


def test_a_run_makes_each_partition_once_and_closes_its_own(device):
    from shimrt.torch.policies import Partition, Policy
    from shimrt.torch.resources import Resources
    run = Resources(device, keep_partitions=False)
    try:
        part = run.partition(16)
    except ShimrtError as exc:
        pytest.skip(f"no SM partition here: {exc}")
    assert run.partition(16) is part
    assert run.stream_of(Policy("p", compute=Partition(16), ctas=8)) is part.stream
    assert run.stream_of(Policy("plain")) is None
    assert part.kept.target.num_sms >= 16
    assert part.kept.target.num_sms + part.rest.target.num_sms <= device.target.num_sms
    run.close()
    assert part.stream.closed


def test_overlaps_share_the_processs_partitions_and_leave_them_open(device):
    from shimrt.torch.resources import Resources
    first, second = Resources(device, keep_partitions=True), Resources(device, keep_partitions=True)
    try:
        part = first.partition(24)
    except ShimrtError as exc:
        pytest.skip(f"no SM partition here: {exc}")
    assert second.partition(24) is part
    first.close()
    second.close()
    assert not part.stream.closed
    part.stream.synchronize(10)


def test_interposers_are_made_once_and_auto_keeps_its_picks(device):
    from shimrt.torch.policies import Policy, Shaping
    from shimrt.torch.resources import Resources
    run = Resources(device, keep_partitions=False)
    two, three = run.interposer(2), run.interposer(3)
    assert run.interposer(2) is two and two.cap == 2 and three.cap == 3
    assert run.settle(Policy("s", compute=Shaping(2))) == two.settle
    assert run.settle(Policy("plain")) is None
    run.close_interposers(keep=[3])
    assert run.interposer(3) is three and run.interposer(2) is not two
    run.close()


def test_shaping_is_refused_with_the_reason_where_another_tool_holds_cupti(device):
    """CUPTI takes one subscriber per process: with one held (here a LaunchInterposer of shimrt's
    own, as torch.profiler or Nsight would hold it), a shaping policy is refused when its resources
    are made (auto drops it, saying why), not at its first step; its Interposer is left inactive,
    and once CUPTI is free the same policy is made."""
    from shimrt import UsageError
    from shimrt.torch.policies import Policy, Shaping
    from shimrt.torch.resources import Resources
    if device.backend != "cuda":
        pytest.skip("launch interposition is CUDA's (CUPTI)")
    run = Resources(device, keep_partitions=False)
    shaping = Policy("s", compute=Shaping(2))
    with device.interpose_launches(lambda launch: None):
        with pytest.raises(UsageError, match="CUPTI, whose one subscriber per process another tool holds"):
            run.prepare(shaping)
    run.prepare(shaping)  # CUPTI free again: the same Interposer subscribes
    assert run.interposer(2).report()["launches"] == 0
    run.close()
