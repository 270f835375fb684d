"""docs/examples.md: it lists every example in examples/, and its Kubernetes PyTorchJob is consistent: a Kubeflow
v1 PyTorchJob whose container the operator recognises, torchrun started with the operator's node count, node rank
and master, one process per GPU the pod asks for, and dattn verify options that exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "examples.md"


def pytorchjob() -> dict:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    jobs = [doc for doc in map(yaml.safe_load, blocks) if isinstance(doc, dict) and doc.get("kind") == "PyTorchJob"]
    assert len(jobs) == 1, "docs/examples.md should hold one PyTorchJob manifest"
    return jobs[0]


def test_every_example_is_listed():
    text = DOC.read_text()
    missing = [
        p.name for p in sorted((ROOT / "examples").iterdir()) if p.is_file() and f"examples/{p.name}" not in text
    ]
    assert not missing, f"docs/examples.md does not list {missing}"


def test_the_pytorchjob_runs_torchrun_with_the_operators_layout():
    job = pytorchjob()
    assert job["apiVersion"] == "kubeflow.org/v1"
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker"} and replicas["Master"]["replicas"] == 1
    nproc = int(job["spec"]["nprocPerNode"])
    for role, spec in replicas.items():
        [container] = spec["template"]["spec"]["containers"]
        assert container["name"] == "pytorch", role  # the operator injects its variables into this container
        assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == nproc, role
        command = " ".join(container["command"] + container["args"])
        for option, variable in (
            ("--nnodes", "$PET_NNODES"),
            ("--nproc-per-node", "$PET_NPROC_PER_NODE"),
            ("--node-rank", "$PET_NODE_RANK"),
            ("--master-addr", "$MASTER_ADDR"),
            ("--master-port", "$MASTER_PORT"),
        ):
            assert f'{option} "{variable}"' in command, (role, option)
        assert "torchrun" in command and "-m dattn_cli verify --attach --device cuda" in command


def test_the_pytorchjob_passes_only_verify_options_that_exist():
    job = pytorchjob()
    args = " ".join(job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"])
    options = set(re.findall(r"(--[a-z][a-z-]*)", args.split("-m dattn_cli verify", 1)[1]))
    helptext = subprocess.run(
        [sys.executable, "-m", "dattn_cli", "verify", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
        timeout=120,
    ).stdout
    unknown = [o for o in sorted(options) if not re.search(rf"{re.escape(o)}\b", helptext)]
    assert not unknown and len(options) >= 8, unknown
