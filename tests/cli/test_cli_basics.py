"""The first commands a new user types: plain `dattn`, `dattn --version`, shell completion (subprocesses,
as a shell runs them)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

import dattn_cli

ROOT = Path(__file__).resolve().parents[2]


def dattn(*args: str, env: dict | None = None, from_bash: bool = False) -> subprocess.CompletedProcess:
    """`from_bash`: started by a bash process that stays its parent, as from a terminal. Typer detects the shell of
    --show/--install-completion from the parent processes (shellingham), and a test run orphaned from its
    shell (a background job whose shell exited) has none."""
    command = [sys.executable, "-m", "dattn_cli", *args]
    if from_bash:
        command = ["bash", "-c", '"$0" "$@"; exit $?', *command]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}, cwd=ROOT
    )


def test_plain_dattn_prints_the_help_and_exits_0():
    done = dattn()
    assert done.returncode == 0, done.stderr
    assert "Usage: dattn" in done.stdout and "Traceback" not in done.stderr
    for command in ("verify", "bench", "profile", "plan", "impls", "env"):
        assert re.search(rf"\b{command}\b", done.stdout), command


def test_version_names_dattn_torch_and_the_commit():
    done = dattn("--version")
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith(f"dattn {dattn_cli.__version__}") and line.endswith(f"torch {torch.__version__}")
    if (ROOT / ".git").exists() and shutil.which("git"):
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        assert f"(git {commit})" in line


def test_show_completion_prints_a_bash_script():
    done = dattn("--show-completion", "bash", from_bash=True)
    assert done.returncode == 0, done.stderr
    assert "_DATTN_COMPLETE=complete_bash" in done.stdout
    assert "complete -o default -F _dattn_completion dattn" in done.stdout


def test_install_completion_writes_the_script_and_hooks_bashrc(tmp_path):
    done = dattn("--install-completion", "bash", env={"HOME": str(tmp_path)}, from_bash=True)
    assert done.returncode == 0, done.stderr
    bashrc = (tmp_path / ".bashrc").read_text()
    sourced = re.search(r"source '?([^'\n]+)'?", bashrc)
    assert sourced, bashrc
    script = Path(sourced.group(1)).read_text()
    assert str(tmp_path) in sourced.group(1) and "_dattn_completion" in script and "dattn" in script


def test_completion_completes_commands_and_options():
    done = dattn(env={"_DATTN_COMPLETE": "complete_bash", "COMP_WORDS": "dattn ver", "COMP_CWORD": "1"})
    assert done.returncode == 0 and done.stdout.split() == ["verify"], done.stdout + done.stderr
    done = dattn(env={"_DATTN_COMPLETE": "complete_bash", "COMP_WORDS": "dattn plan --max-", "COMP_CWORD": "2"})
    assert set(done.stdout.split()) == {"--max-memory", "--max-seq"}
