"""runtime.attach without a process group: which launcher started this process, the master's address, the
variables stripped for ranks spawned here, and bad launcher environments as one clear error."""

import pytest

from dattn_cli.runtime import attach
from dattn_cli.runtime.attach import World, detect, first_host

TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.5",
    "MASTER_PORT": "29400",
    "TORCHELASTIC_RUN_ID": "job",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
}
SRUN = {
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_JOB_NODELIST": "gpu[07-08,11]",
    "SLURM_STEP_NODELIST": "gpu[03-04]",
}


def test_torchrun_environment():
    assert detect(TORCHRUN) == World(3, 4, 1, "10.0.0.5", 29400, "torchrun")
    plain = {k: v for k, v in TORCHRUN.items() if not k.startswith("TORCHELASTIC")}
    assert detect(plain).launcher == "env" and detect({**plain, "MASTER_PORT": ""}).master_port == 29500
    assert detect(TORCHRUN, master_addr="head", master_port=1234).master_addr == "head"


def test_srun_step_environment():
    world = detect(SRUN)
    assert world == World(5, 8, 1, "gpu03", 29500, "slurm")  # the step's first node, not the job's
    assert detect({**SRUN, "MASTER_ADDR": "login1", "MASTER_PORT": "4000"}).master_addr == "login1"
    assert detect({**SRUN}, master_addr="n1").master_addr == "n1"
    allocation_shell = {k: v for k, v in SRUN.items() if k != "SLURM_STEP_ID"}
    assert detect(allocation_shell) is None  # salloc's shell is not a rank: dattn spawns as usual there
    assert detect({}) is None


@pytest.mark.parametrize(
    "nodelist, first",
    [
        ("gpu[03-05,07],cpu1", "gpu03"),
        ("node1,node2", "node1"),
        ("a-b-01", "a-b-01"),
        ("x[1]", "x1"),
        ("n[009-010]", "n009"),
    ],
)
def test_first_host_of_a_node_list(nodelist, first):
    assert first_host(nodelist) == first


@pytest.mark.parametrize(
    "env, message",
    [
        ({**TORCHRUN, "RANK": "x"}, "RANK='x' is not a non-negative integer"),
        ({**TORCHRUN, "RANK": "4"}, "rank 4 of world size 4 is not a rank of that world"),
        ({k: v for k, v in TORCHRUN.items() if k != "MASTER_ADDR"}, "MASTER_ADDR is not"),
        ({**TORCHRUN, "MASTER_PORT": "70000"}, "master port 70000 is not a TCP port"),
        ({**SRUN, "SLURM_NTASKS": "-1"}, "SLURM_NTASKS='-1'"),
    ],
)
def test_bad_launcher_environments_are_one_clear_error(env, message):
    with pytest.raises(ValueError, match=message):
        detect(env)


def test_ranks_spawned_here_lose_the_launchers_variables(monkeypatch):
    import os

    for key, value in {**TORCHRUN, "OMP_NUM_THREADS": "2"}.items():
        monkeypatch.setenv(key, value)
    attach.strip_launcher_variables()
    assert not any(k in os.environ for k in TORCHRUN)
    assert os.environ["OMP_NUM_THREADS"] == "2" and "PATH" in os.environ  # everything else stays


@pytest.mark.parametrize(
    "env, ranks",
    [
        ({"LOCAL_WORLD_SIZE": "4"}, 4),
        ({"SLURM_NTASKS_PER_NODE": "2(x3)"}, 2),
        ({"SLURM_NTASKS_PER_NODE": "8,4"}, 8),
        ({}, 1),
    ],
)
def test_local_ranks(monkeypatch, env, ranks):
    for key in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert attach.local_ranks() == ranks
