"""benchmarks/parallel_memory_check.py's tracker: views of existing weights are not counted, a storage freed by
resizing (FSDP2's unsharded parameters) counts at its size when sampled, DTensor-free tensors as usual."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from parallel_memory_check import LiveBytes  # noqa: E402


def test_views_of_existing_weights_are_not_counted():
    weight = torch.zeros(256, 256)
    with LiveBytes([weight]) as tracker:
        weight.t().contiguous()  # a new 256 KiB storage, freed at once; the view of the weight is not counted
        kept = torch.ones(128, 128)
    assert tracker.peak == 256 * 256 * 4
    assert kept.numel() == 128 * 128


def test_a_storage_resized_to_nothing_stops_counting():
    with LiveBytes() as tracker:
        buffer = torch.empty(1024)
        buffer.untyped_storage().resize_(0)
        torch.zeros(512)  # sampled again: the resized storage counts 0 bytes now
        buffer.untyped_storage().resize_(2048 * 4)
        torch.zeros(1)
    assert tracker.peak == 2048 * 4 + 4
