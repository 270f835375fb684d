"""check_consistent (kernels/distributed/comm.py): its all_gather and host sync run once per new (group, shape,
dtype, config) per module, or on every call under DATTN_DEBUG_CONSISTENCY=1; a mismatch is still caught."""

import pytest

from dattn_cli.runtime.launch import DistributedError, run_distributed
from tests.distributed import workers


def test_the_consistency_collective_runs_once_per_new_shape_per_module():
    # three modules (ring, head-parallel, block-sparse ring): 3 calls of one shape -> 1 check each; a new shape
    # -> 1 more each; both shapes again -> none; under DATTN_DEBUG_CONSISTENCY=1, 2 calls -> 2 more each
    for counts in run_distributed(workers.consistency_all_gathers, 2, timeout_s=60):
        assert counts == [3, 6, 6, 12], counts


@pytest.mark.parametrize("debug", [False, True])
def test_a_mismatch_after_a_checked_shape_is_caught_naming_the_ranks(debug):
    # without the option: both ranks on new, different shapes; with it: rank 0 repeats a checked shape
    with pytest.raises(DistributedError, match=r"ranks disagree on shard shape.* ranks \[1\] differ from rank 0"):
        run_distributed(workers.mismatch_after_a_checked_shape, 2, debug, timeout_s=30)
