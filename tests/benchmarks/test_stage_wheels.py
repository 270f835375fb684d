"""benchmarks/stage_wheels.sh splits wheels into two carry sets under the limit, cutting the largest; gpu_run.sh's
fa4 steps re-join them over two calls, check every sha256 and install them with no index."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def tiny_wheel(folder: Path, name: str, payload_kib: int) -> Path:
    """A valid pure-Python wheel whose module carries `payload_kib` KiB of incompressible bytes."""
    path = folder / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{name}/__init__.py", "VALUE = 1\n")
        z.writestr(f"{name}/payload.bin", os.urandom(payload_kib * 1024))
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def run(script: str, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(ROOT / "benchmarks" / script), *args],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_two_carry_sets_rejoined_checked_and_installed(tmp_path):
    wheels = tmp_path / "w"
    wheels.mkdir()
    originals = [tiny_wheel(wheels, n, kib) for n, kib in (("peer_a", 300), ("peer_b", 200), ("peer_big", 900))]
    done = run("stage_wheels.sh", "split", cwd=tmp_path, WHEELS=str(wheels), LIMIT_MIB="1")
    assert done.returncode == 0, done.stderr
    for carry in ("a", "b"):
        files = list((tmp_path / ".fa4" / carry).iterdir())
        assert sum(f.stat().st_size for f in files) < 2**20
    assert len(list((tmp_path / ".fa4").glob("*/parts.peer_big-*"))) == 2  # the largest wheel, cut in two

    # on the device: the first call has set a only, the second set b only (set a kept in .fa4_staged/)
    env = {"DEVICE": "cpu", "RESULTS": str(tmp_path / "res"), "OUT": str(tmp_path / "out")}
    shutil.move(tmp_path / ".fa4" / "b", tmp_path / "b_later")
    first = run("gpu_run.sh", "fa4_stage_a", cwd=tmp_path, **env)
    assert first.returncode == 0 and (tmp_path / "res" / "done.fa4_stage_a").exists(), first.stdout
    shutil.rmtree(tmp_path / ".fa4" / "a")
    shutil.move(tmp_path / "b_later", tmp_path / ".fa4" / "b")
    second = run("gpu_run.sh", "fa4_install", cwd=tmp_path, **env)
    log = (tmp_path / "res" / "gpu_run.log").read_text()
    assert (tmp_path / "res" / "done.fa4_install").exists(), log
    joined = tmp_path / ".fa4_staged" / originals[2].name
    assert hashlib.sha256(joined.read_bytes()).digest() == hashlib.sha256(originals[2].read_bytes()).digest()
    for name in ("peer_a", "peer_b", "peer_big"):
        assert (tmp_path / ".gpu_site" / name / "payload.bin").exists()
    assert "import_s" in json.loads((tmp_path / "res" / "fa4_install.json").read_text())
    assert second.returncode == 0


def test_a_corrupt_part_fails_the_install(tmp_path):
    wheels = tmp_path / "w"
    wheels.mkdir()
    tiny_wheel(wheels, "peer_a", 100)
    tiny_wheel(wheels, "peer_big", 1500)
    assert run("stage_wheels.sh", "split", cwd=tmp_path, WHEELS=str(wheels), LIMIT_MIB="1").returncode == 0
    part = next((tmp_path / ".fa4").glob("b/parts.*"))
    part.write_bytes(part.read_bytes()[:-1] + b"x")
    env = {"DEVICE": "cpu", "RESULTS": str(tmp_path / "res"), "OUT": str(tmp_path / "out")}
    run("gpu_run.sh", "fa4_stage_a", "fa4_install", cwd=tmp_path, **env)
    assert not (tmp_path / "res" / "done.fa4_install").exists()
    assert "FAILED" in (tmp_path / "res" / "gpu_run.log").read_text()
