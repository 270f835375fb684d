"""The worker's memory cap: the address space on CPU, the caching allocator's share of the card on CUDA."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from dattn_cli.cli import bench as cli_bench
from dattn_cli.runtime import gpustate, limits


def test_cpu_caps_the_address_space(monkeypatch):
    calls = []
    monkeypatch.setattr(limits, "cap_address_space", lambda cap: calls.append(cap))
    limits.cap_memory(3 * 2**30, "cpu")
    assert calls == [3 * 2**30]


def test_cuda_sets_the_allocator_fraction_below_the_card(monkeypatch):
    fractions = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=140 * 2**30))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, i: fractions.append((f, i)))
    monkeypatch.setattr(limits, "cap_address_space", lambda cap: (_ for _ in ()).throw(AssertionError("CPU cap")))
    limits.cap_memory(79 * 2**30, "cuda:0")  # an H200 run as an 80 GB card
    limits.cap_memory(200 * 2**30, "cuda")  # more than the card: no cap
    assert fractions == [(79 / 140, 0)]


def test_cuda_default_is_the_whole_card(monkeypatch):
    monkeypatch.setattr(gpustate, "gpu_memory_bytes", lambda index=0: 80 * 2**30)
    assert cli_bench.default_max_memory("cuda") == 80 * 2**30
    monkeypatch.setattr(gpustate, "gpu_memory_bytes", lambda index=0: None)  # no NVML: the host rule
    host = cli_bench.default_max_memory("cuda")
    assert 0 < host != 80 * 2**30
