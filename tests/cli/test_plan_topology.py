"""plan --gpus-per-node: the profile's devices per node overridden, each group charged at the link it crosses."""

import json

import pytest

from tests.cli.test_verify_env import run_cli

MODEL = ["plan", "--model", "llama-3.1-8b", "--profile", "h100-sxm-80gb", "--seq-len", "8192", "--dtype", "bfloat16"]


def plan(capsys, *args: str) -> dict:
    code, stdout, err = run_cli([*MODEL, *args, "--json", "-"], capsys)
    assert code == 0, err
    return json.loads(stdout)


def test_data_parallel_collectives_cross_nodes_when_the_node_is_smaller_than_the_group(capsys):
    inside = plan(capsys, "--devices", "8", "--zero", "3")
    across = plan(capsys, "--devices", "8", "--zero", "3", "--gpus-per-node", "4")
    assert {c["link"] for c in inside["time"]["collectives"]} == {"intra-node"}
    assert {c["link"] for c in across["time"]["collectives"]} == {"inter-node"}
    assert across["time"]["total_s"] > inside["time"]["total_s"]  # 50 against 450 GB/s per GPU
    assert plan(capsys, "--devices", "8", "--zero", "3", "--gpus-per-node", "16")["time"] == inside["time"]


def test_the_sequence_parallel_group_is_innermost(capsys):
    args = ["--impl", "RingDilatedAttention", "--segments", "2048", "--dilations", "1", "--zero", "3"]
    ring = lambda *more: next(
        c for c in plan(capsys, *args, *more)["time"]["collectives"] if c["name"].startswith("attention")
    )
    assert ring("--devices", "8", "--sequence-parallel", "4", "--gpus-per-node", "4")["link"] == "intra-node"
    assert ring("--devices", "8", "--sequence-parallel", "8", "--gpus-per-node", "4")["link"] == "inter-node"


@pytest.mark.parametrize("value", ["0", "5000"])
def test_bad_gpus_per_node_is_one_line(value, capsys):
    code, _, err = run_cli([*MODEL, "--gpus-per-node", value], capsys)
    assert code == 2 and err.strip() == f"dattn: error: --gpus-per-node must be from 1 to 4,096, got {int(value):,}"
