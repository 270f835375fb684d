"""examples/train_longnet_fsdp_sp.py under torchrun on CPU (gloo): the command the example documents runs and
prints finite losses, and sequence parallelism changes nothing but rounding: --sp 2 on 4 ranks (2 replicas, each
sequence on 2 ranks) prints the losses and gradient norms of --sp 1 on 2 ranks (the same 2 replicas, each
sequence on one rank). Step 1's loss checks the forward (rotary positions of the shards included), the gradient
norms check the summed gradients, step 2's loss the optimizer step taken with them."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_longnet_fsdp_sp.py"
TIMEOUT = 300  # a bound against hangs (4 ranks share 2 CPUs here), not a timing check
STEP = re.compile(r"^step (\d+)/(\d+) loss (\S+) grad-norm (\S+)$", re.M)

pytestmark = [
    pytest.mark.slow,  # whole jobs of several processes
    pytest.mark.skipif(importlib.util.find_spec("torch.distributed.run") is None, reason="torchrun is not available"),
    pytest.mark.skipif(sys.platform != "linux", reason="process groups over loopback: Linux"),
]


def torchrun(nproc: int, *args: str, script: Path = SCRIPT) -> tuple[int, str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "TORCHELASTIC_", "PET_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")  # CPU and gloo, also on a GPU host
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        str(script),
        *args,
    ]
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"timed out after {TIMEOUT} s: {' '.join(command)}\n{(exc.stderr or '')[-3000:]}")
    return done.returncode, done.stdout, done.stderr


def steps(out: str) -> list[tuple[float, float]]:
    return [(float(loss), float(norm)) for _, _, loss, norm in STEP.findall(out)]


@pytest.fixture(scope="module")
def sp2():
    return torchrun(4, "--sp", "2", "--steps", "2")


def test_the_documented_command_trains(sp2):
    code, out, err = sp2
    assert code == 0, err[-4000:]
    assert out.startswith("world 4 = dp 2 x sp 2 on cpu (gloo)"), out
    assert "DistributedImprovedDilatedAttention over 2 rank(s)" in out, out
    found = steps(out)
    assert len(found) == 2 and all(math.isfinite(x) for pair in found for x in pair), out
    assert abs(found[0][0] - math.log(256)) < 2, "an untrained model's loss is about ln(vocab)"
    assert "Traceback" not in err


def test_sequence_parallel_gives_the_losses_and_gradients_of_one_rank_per_sequence(sp2):
    code, out, err = torchrun(2, "--sp", "1", "--steps", "2")
    assert code == 0, err[-4000:]
    assert out.startswith("world 2 = dp 2 x sp 1 on cpu (gloo)"), out
    whole, sharded = steps(out), steps(sp2[1])
    assert len(whole) == len(sharded) == 2
    for step, ((loss_a, norm_a), (loss_b, norm_b)) in enumerate(zip(whole, sharded), 1):
        assert abs(loss_a - loss_b) <= 2e-5 * loss_a, (step, whole, sharded)  # float32 sums in another order
        assert abs(norm_a - norm_b) <= 2e-5 * norm_a, (step, whole, sharded)


def test_an_sp_that_does_not_divide_the_world_is_one_clear_error():
    code, out, err = torchrun(2, "--sp", "3", "--steps", "1")
    assert code != 0 and "--sp 3 does not divide the world size 2: pass a divisor of 2" in err, err[-3000:]
