"""examples/slurm_verify.sbatch without SLURM: stand-in `scontrol` and `srun` on PATH (srun starts the command once
per task, locally, with the SLURM_* variables a real step gives each task). The script's command line is checked
against `dattn verify --help`, the master address and per-job port it exports, and a real two-task run on CPU: one
report from rank 0 with every check passed at world size 2, and a bad option failing the job."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dattn_cli.runtime.launch import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "slurm_verify.sbatch"
TIMEOUT = 300  # a bound against hangs, not a timing check
SMALL = [
    "--seq-len",
    "32",
    "--segments",
    "8,32",
    "--dilations",
    "1,2",
    "--heads",
    "2",
    "--head-dim",
    "8",
    "--semantics",
    "longnet",
    "--causal",
    "--dist-timeout",
    "60",
]  # a later option wins over the script's

pytestmark = [
    pytest.mark.slow,  # whole jobs of several processes
    pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash"),
    pytest.mark.skipif(sys.platform != "linux", reason="process groups over loopback: Linux"),
]

SRUN = r"""#!/bin/bash
# stand-in for srun: the command once per task, here, with the variables srun gives a task of a job step
while [[ "$1" == -* ]]; do shift; done
if [[ -n "${FAKE_SRUN_ECHO:-}" ]]; then echo "MASTER=$MASTER_ADDR:$MASTER_PORT"; echo "COMMAND=$*"; exit 0; fi
pids=()
for ((task = 0; task < SLURM_NTASKS; task++)); do
    SLURM_PROCID=$task SLURM_LOCALID=$task SLURM_STEP_ID=0 SLURM_STEP_NODELIST=$SLURM_JOB_NODELIST "$@" &
    pids+=($!)
done
code=0
for pid in "${pids[@]}"; do wait "$pid" || code=$?; done
exit $code
"""
SCONTROL = """#!/bin/bash
[[ "$1 $2" == "show hostnames" ]] || exit 2
tr ',' '\\n' <<< "$3"
"""


@pytest.fixture
def job(tmp_path):
    """(run the script with these arguments and extra environment -> (exit code, stdout, stderr), work dir)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {
        "srun": SRUN,
        "scontrol": SCONTROL,
        "python": f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n',
    }.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "TORCHELASTIC_", "PET_", "DATTN_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
        SLURM_JOB_NODELIST="127.0.0.1,127.0.0.2",
        SLURM_JOB_ID="4242",
        SLURM_NTASKS="2",
        SLURM_JOB_NUM_NODES="1",
        SLURM_CPUS_PER_TASK="1",
    )

    def run(*args: str, **extra: str) -> tuple[int, str, str]:
        try:
            done = subprocess.run(
                ["bash", str(SCRIPT), *args],
                cwd=tmp_path,
                env={**env, **extra},
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
            )
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"timed out after {TIMEOUT} s\n{(exc.stderr or '')[-3000:]}")
        return done.returncode, done.stdout, done.stderr

    return run, tmp_path


def test_the_script_exports_the_first_node_and_a_per_job_port_and_runs_verify_attached(job):
    run, _ = job
    code, out, err = run(FAKE_SRUN_ECHO="1")
    assert code == 0, err
    assert "MASTER=127.0.0.1:24242" in out  # first host of the node list; 20000 + job id mod 20000
    command = re.search(r"^COMMAND=(.*)$", out, re.M).group(1).split()
    assert command[:5] == ["python", "-m", "dattn_cli", "verify", "--attach"]
    assert command[command.index("--device") + 1] == "cuda" and "--json" in command
    code, out, _ = run(FAKE_SRUN_ECHO="1", MASTER_PORT="31000")
    assert "MASTER=127.0.0.1:31000" in out  # an exported MASTER_PORT is kept


def test_every_option_the_script_passes_is_a_verify_option(job):
    run, _ = job
    _, out, _ = run(FAKE_SRUN_ECHO="1")
    options = {w for w in re.search(r"^COMMAND=(.*)$", out, re.M).group(1).split() if w.startswith("--")}
    helptext = subprocess.run(
        [sys.executable, "-m", "dattn_cli", "verify", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
        timeout=120,
    ).stdout
    unknown = [o for o in sorted(options) if not re.search(rf"{re.escape(o)}\b", helptext)]
    assert not unknown and len(options) >= 10, unknown


def test_two_tasks_on_cpu_verify_in_one_world_and_rank_zero_writes_the_report(job):
    run, work = job
    code, out, err = run(*SMALL, DATTN_DEVICE="cpu", DATTN_REPORT="verify.json", MASTER_PORT=str(free_port()))
    assert code == 0, (out[-2000:], err[-4000:])
    assert "dattn verify: 2 ranks on 1 node(s), master 127.0.0.1:" in out
    results = json.loads((work / "verify.json").read_text())["results"]
    impls = {r["impl"] for r in results}
    assert impls == {"RingDilatedAttention", "DistributedImprovedDilatedAttention", "HeadParallelDilatedAttention"}
    assert all(r["passed"] and r["world_size"] == 2 for r in results), results
    assert "Traceback" not in err


def test_a_bad_option_fails_the_job(job):
    run, work = job
    code, _, err = run("--seq-len", "0", DATTN_DEVICE="cpu", DATTN_REPORT="verify.json", MASTER_PORT=str(free_port()))
    assert code == 2 and "--seq-len" in err, err[-3000:]
    assert not (work / "verify.json").exists()
