"""Attach mode as users start it: `dattn verify` and `dattn bench` under torchrun (one node, and two nodes on
loopback in two working directories), under srun's environment (four local processes with SLURM_* set), and
with a rank that dies: one report from rank 0, no duplicate rows, the same exit code on every rank, the dead rank
named within the deadline. Tiny problems; each process imports torch, so these take seconds each."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dattn_cli.runtime.launch import free_port

pytestmark = [
    pytest.mark.slow,  # torchrun and srun worlds: 10-30 s each
    pytest.mark.skipif(sys.platform != "linux", reason="process groups over loopback: Linux"),
]
TIMEOUT = 240
VERIFY = [
    "verify",
    "--impl",
    "RingDilatedAttention",
    "--seq-len",
    "64",
    "--heads",
    "2",
    "--head-dim",
    "8",
    "--segments",
    "16,32",
    "--dilations",
    "1,2",
    "--semantics",
    "longnet",
    "--dist-timeout",
    "60",
]
BENCH = [
    "bench",
    "--impl",
    "RingDilatedAttention",
    "--seq-len",
    "256",
    "--heads",
    "2",
    "--head-dim",
    "8",
    "--segments",
    "64,128",
    "--dilations",
    "1,2",
    "--mode",
    "fwd",
    "--repeat",
    "2",
    "--warmup",
    "0",
    "--dist-timeout",
    "60",
    "--max-seconds",
    "60",
]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def _env(**extra: str) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "TORCHELASTIC_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    return {**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "OMP_NUM_THREADS": "1", **extra}


def _start(cmd: list[str], cwd: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=cwd, env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(procs: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    done = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        done.append((proc.returncode, out, err))
    return done


def _rows(report: Path) -> list[dict]:
    return [r for r in map(json.loads, report.read_text().splitlines()) if r.get("record") == "point"]


def test_torchrun_one_node_verify_and_bench(tmp_path):
    port = str(free_port())
    launch = [
        *TORCHRUN,
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "-m",
        "dattn_cli",
    ]
    [(code, out, err)] = _finish([_start([*launch, *VERIFY, "--json", "verify.json"], tmp_path)])
    assert code == 0, err[-2000:]
    results = json.loads((tmp_path / "verify.json").read_text())["results"]
    assert results and all(r["passed"] and r["world_size"] == 2 for r in results)
    assert out.count("passed") >= 1 and "Traceback" not in err
    [(code, out, err)] = _finish([_start([*launch, *BENCH, "--out", "bench.jsonl"], tmp_path)])
    assert code == 0, err[-2000:]
    rows = _rows(tmp_path / "bench.jsonl")
    assert len(rows) == 1 and rows[0]["status"] == "ok" and rows[0]["world_size"] == 2, rows
    assert len(rows[0]["peak_mem_bytes_per_rank"]) == 2


def test_two_nodes_on_loopback_write_one_report(tmp_path):
    port = str(free_port())
    dirs = [tmp_path / "node0", tmp_path / "node1"]
    for d in dirs:
        d.mkdir()
    for command, report in ((BENCH, "bench.jsonl"), (VERIFY, "verify.json")):
        out_option = ["--out", report] if command is BENCH else ["--json", report]
        procs = [
            _start(
                [
                    *TORCHRUN,
                    "--nnodes",
                    "2",
                    "--nproc-per-node",
                    "2",
                    "--node-rank",
                    str(node),
                    "--rdzv-backend",
                    "static",
                    "--master-addr",
                    "127.0.0.1",
                    "--master-port",
                    port,
                    "-m",
                    "dattn_cli",
                    *command,
                    *out_option,
                ],
                d,
            )
            for node, d in enumerate(dirs)
        ]
        finished = _finish(procs)
        assert [code for code, _, _ in finished] == [0, 0], [err[-1500:] for _, _, err in finished]
        assert (dirs[0] / report).exists() and not (dirs[1] / report).exists()
        port = str(free_port())
    rows = _rows(dirs[0] / "bench.jsonl")
    assert len(rows) == 1 and rows[0]["world_size"] == 4 and len(rows[0]["peak_mem_bytes_per_rank"]) == 4
    results = json.loads((dirs[0] / "verify.json").read_text())["results"]
    assert results and all(r["passed"] and r["world_size"] == 4 for r in results)


def test_srun_environment_four_tasks(tmp_path):
    port = str(free_port())
    slurm = dict(
        SLURM_NTASKS="4",
        SLURM_STEP_ID="0",
        SLURM_JOB_NODELIST="localhost",
        SLURM_STEP_NODELIST="localhost",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=port,
        SLURM_NTASKS_PER_NODE="4",
    )
    procs = [
        _start(
            [sys.executable, "-m", "dattn_cli", *BENCH, "--out", "bench.jsonl"],
            tmp_path,
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            **slurm,
        )
        for rank in range(4)
    ]
    finished = _finish(procs)
    assert [code for code, _, _ in finished] == [0] * 4, [err[-1500:] for _, _, err in finished]
    rows = _rows(tmp_path / "bench.jsonl")
    assert len(rows) == 1 and rows[0]["world_size"] == 4
    assert all(out == "" for _, out, _ in finished[1:])  # only rank 0 prints


def test_a_dead_rank_is_named_within_the_deadline(tmp_path):
    """Rank 1 joins the world and dies; rank 0 (dattn bench) must end with exit 1 naming rank 1, not hang."""
    port = str(free_port())
    env = dict(WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port, LOCAL_RANK="0")
    dying = (
        "import os, datetime, torch.distributed as d; "
        "d.init_process_group('gloo', rank=1, world_size=2, init_method='env://', "
        "timeout=datetime.timedelta(seconds=30)); os._exit(7)"
    )
    bench = [sys.executable, "-m", "dattn_cli", *BENCH[:-4], "--dist-timeout", "10", "--out", "bench.jsonl"]
    procs = [_start(bench, tmp_path, RANK="0", **env), _start([sys.executable, "-c", dying], tmp_path, RANK="1", **env)]
    (code, out, err), (dead, _, _) = _finish(procs)
    assert dead == 7 and code == 1, err[-2000:]
    rows = _rows(tmp_path / "bench.jsonl")
    assert rows[0]["status"] == "error" and "rank 1" in rows[0]["error"], rows
    assert "rank 1" in err and "Traceback" not in err


@pytest.mark.skipif(shutil.which("dattn") is None, reason="the dattn console script is not installed")
def test_torchrun_no_python_runs_the_console_script(tmp_path):
    port = str(free_port())
    cmd = [
        *TORCHRUN,
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--no-python",
        "dattn",
        *VERIFY,
    ]
    [(code, out, err)] = _finish([_start(cmd, tmp_path)])
    assert code == 0 and "passed" in out, err[-2000:]


def test_spawning_inside_a_launchers_world_and_bad_attach_options(tmp_path):
    """--spawn inside a torchrun environment spawns its own group (the launcher's variables stripped);
    --attach without a launcher and a --world-size other than the launcher's are one clear error."""
    env = dict(
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        TORCHELASTIC_USE_AGENT_STORE="True",
        TORCHELASTIC_RUN_ID="x",
    )
    [(code, out, err)] = _finish(
        [_start([sys.executable, "-m", "dattn_cli", *VERIFY, "--world-size", "2", "--spawn"], tmp_path, **env)]
    )
    assert code == 0 and "passed" in out, err[-2000:]
    [(code, _, err)] = _finish([_start([sys.executable, "-m", "dattn_cli", *VERIFY, "--attach"], tmp_path)])
    assert code == 2 and err.startswith("dattn: error: --attach: no launcher environment found"), err
    env["WORLD_SIZE"], env["RANK"] = "2", "0"
    [(code, _, err)] = _finish(
        [_start([sys.executable, "-m", "dattn_cli", *VERIFY, "--world-size", "3"], tmp_path, **env)]
    )
    assert code == 2 and "--world-size 3: this process is rank 0 of a world of 2" in err, err
