"""What a spawned rank starts with (runtime/launch.py): CPU ranks share the machine's CPUs out, and the forkserver
has already imported what the first autograd call would import in every rank."""

import sys

from dattn_cli.runtime.contention import measurement_threads
from dattn_cli.runtime.launch import run_distributed


def threads_and_modules(rank, world):
    import torch

    return torch.get_num_threads(), "torch.fx.experimental.symbolic_shapes" in sys.modules


def test_gloo_ranks_share_the_cpus_and_start_with_autograds_imports():
    got = run_distributed(threads_and_modules, 2, backend="gloo", timeout_s=60)
    assert got == [(measurement_threads(None, 2), True)] * 2
