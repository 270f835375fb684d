"""plan/nccl.py: NCCL's buffers per device, by the communicators a layout makes and what they run."""

import pytest

from dattn_cli.plan import nccl
from dattn_cli.plan.parallel import Training, model_memory
from dattn_cli.plan.profiles import load_profile
from dattn_cli.workload import Problem

MiB = 2**20


@pytest.mark.parametrize(
    "devices, sp, strategy, per_node, expected",
    [
        (1, 1, "single", 8, 0),  # no communicator
        (8, 1, "single", 8, 320 * MiB),  # the world's: collectives, 16 channels x 2 connections x 10 MiB
        (8, 8, "ring", 8, 320 * MiB + 2 * 32 * 12 * MiB),  # sp = world: one communicator, two ring neighbours
        (16, 4, "ring", 8, 3 * 320 * MiB + 2 * 32 * 12 * MiB),  # world, dp and sp groups
        (16, 2, "ring", 8, 3 * 320 * MiB + 32 * 12 * MiB),  # a ring of two: one neighbour
        (32, 16, "ring", 8, 3 * 320 * MiB + 2 * 2 * 16 * 128 * 1024),  # the ring crosses nodes: the shared pool
        (16, 4, "allgather", 8, 3 * 320 * MiB),  # all-gathers are collectives
        (8, 4, "head_parallel", 8, 3 * 320 * MiB + 3 * 32 * 12 * MiB),  # all-to-all: every peer
    ],
)
def test_buffer_bytes_by_layout(devices, sp, strategy, per_node, expected):
    assert nccl.buffer_bytes(devices, sp, 1, strategy, per_node)[0] == expected


def test_tensor_parallel_adds_its_group_and_its_shard_group():
    assert nccl.buffer_bytes(16, 1, 8, "dense", 8)[0] == 3 * 320 * MiB
    assert nccl.buffer_bytes(8, 1, 8, "dense", 8)[0] == 320 * MiB  # tensor parallel over the whole world


def test_a_gpu_plan_over_devices_holds_them_a_cpu_or_single_device_plan_does_not():
    s = Problem(
        impl="ImprovedMultiheadDilatedAttention",
        target="model",
        seq_len=4096,
        heads=8,
        head_dim=64,
        layers=2,
        vocab_size=1000,
        dtype="bfloat16",
        mode="fwdbwd",
        segment_lengths=[1024],
        dilation_rates=[1],
    )
    gpu = load_profile("h100-sxm-80gb")
    items = model_memory(s, gpu, Training(devices=8), "cuda").items
    assert items[next(k for k in items if k.startswith(nccl.ITEM))] == 320 * MiB
    assert not any(k.startswith(nccl.ITEM) for k in model_memory(s, gpu, Training(devices=1), "cuda").items)
    assert not any(k.startswith(nccl.ITEM) for k in model_memory(s, gpu, Training(devices=8), "cpu").items)
