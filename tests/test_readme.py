"""The README's tour ("A short tour" block), run line by line with CI-sized options, so the README cannot rot.

Every line of the tour has an entry in TOUR, keyed by the command exactly as the README writes it (comment
dropped, quoting normalised). An entry says how the line is made small: option values it replaces (the option
must be in the line, so a replacement cannot silently stop applying), options it adds, and why. A README
line without an entry, or an entry without a README line, fails test_every_tour_line_has_an_entry: a new
line in the README needs a new entry here (the failure prints the key to paste).

The lines run in README order, each in its own bash subprocess with a timeout, in one temporary directory
shared by the module, as a user runs the tour: the r.jsonl the first bench line writes is resumed, used as
the baseline and checked by `plan --check` further down, opts.yaml is written by the `echo` line before
`--config` reads it. Run the module as a whole (`-k` on one later line finds no r.jsonl). `dattn`,
`python` and `torchrun` are this interpreter (`-m dattn_cli`, `-m torch.distributed.run`) with the checkout
first on PYTHONPATH; examples/ and benchmarks/ paths point into the checkout; benchmarks/ scripts write their
new reports under results/ in the temporary directory. Nothing here needs CUDA; nothing is skipped.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
OPERATORS = {"|", "||", "&&", ">", ">>", "<", ";", "2>", "&"}


@dataclass(frozen=True)
class Small:
    """How one tour line runs in CI."""

    set: dict[str, str] = field(default_factory=dict)  # option -> value replacing the README's (must be in the line)
    add: tuple[str, ...] = ()  # appended to the line's first command
    why: str = ""  # what the CI sizes leave out; required when the line is changed
    timeout: int = 180  # seconds; a limit against hangs, not a timing check
    exit_codes: tuple[int, ...] = (0,)
    expect: str = ""  # regex the line's output (stdout and stderr) must match
    files: tuple[str, ...] = ()  # glob patterns that must match a file in the tour directory afterwards


BENCH_SMALL = ("--repeat", "1", "--warmup", "0")
ONE_CASE_SET = ("--semantics", "longnet", "--causal")
PROFILE_SMALL = ("--iterations", "2", "--warmup", "0")

TOUR: dict[str, Small] = {
    "dattn impls": Small(expect=r"ImprovedDilatedAttention"),
    "dattn verify --quick": Small(
        add=("--impl", "ImprovedDilatedAttention", *ONE_CASE_SET),
        expect=r"verify passed",
        why="one implementation, longnet, causal: the whole quick matrix (280 checks) takes minutes on 2 cores; "
        "tests/ check every implementation",
    ),
    "dattn verify --seq-len 4096 --segments 1024,2048 --dilations 1,2 --heads 4": Small(
        set={"--seq-len": "256", "--segments": "64,128"},
        add=ONE_CASE_SET,
        expect=r"verify passed",
        why="N and the segments divided by 16, longnet, causal; every implementation that can run it still does",
    ),
    "dattn verify --impl ImprovedDilatedAttention --dtype bfloat16 --json verify.json": Small(
        add=ONE_CASE_SET, files=("verify.json",), why="longnet, causal only"
    ),
    "dattn verify --full --backend math --backend sdpa": Small(
        add=("--impl", "ImprovedDilatedAttention", *ONE_CASE_SET),
        expect=r"verify passed",
        why="one implementation, longnet, causal: the full matrix for every implementation takes many minutes",
    ),
    "dattn bench --impl ImprovedDilatedAttention --impl sdpa --seq-len 8k,16k,32k --out r.jsonl --plot r.png": Small(
        set={"--seq-len": "1k"}, add=BENCH_SMALL, files=("r.jsonl", "r.png"), why="N = 1k, one timed call"
    ),
    "dattn bench --impl ImprovedDilatedAttention --impl sdpa --seq-len 8k,16k,32k --out r.jsonl --resume": Small(
        set={"--seq-len": "1k"}, add=BENCH_SMALL, why="the points of the line that wrote r.jsonl"
    ),
    "dattn bench --impl ImprovedDilatedAttention --seq-len 8k,16k --baseline r.jsonl --fail-on-regression 10": Small(
        set={"--seq-len": "1k"},
        add=BENCH_SMALL,
        exit_codes=(3,),
        expect=r"regression gate.*inconclusive",
        why="N = 1k against r.jsonl's 1k row; one timed call a side is too few for a 95% CI, so the gate must say "
        "inconclusive (exit 3); tests/cli/test_bench_cli.py checks exits 0, 1 and 3 with enough samples",
    ),
    "dattn bench --interleave --impl ImprovedDilatedAttention --impl sdpa --seq-len 8k --out ab.jsonl": Small(
        set={"--seq-len": "1k"},
        add=("--repeat", "6", "--warmup", "1", "--mode", "fwd"),
        files=("ab.jsonl",),
        expect=r"round-robin",
        why="N = 1k forward, 6 timed calls a line",
    ),
    "dattn compare ab.jsonl --a ImprovedDilatedAttention --b sdpa": Small(
        exit_codes=(0, 1, 3),
        expect=r"verdict: ",
        why="which is faster at 1k, and whether 6 calls can tell, depends on this machine; exit 2 or a crash fails",
    ),
    "dattn bench --until-oom --max-memory 2GiB --impl math --impl ImprovedDilatedAttention": Small(
        set={"--max-memory": "64MiB"},
        add=("--start-seq-len", "1k", *BENCH_SMALL),
        why="a 64 MiB cap: each search ends at its first point (math predicted over the cap, Improved measured "
        "over it); the 2 GiB search takes about 5 minutes (benchmarks/RESULTS.md), the search logic is "
        "tested in tests/bench",
    ),
    "dattn plan --check r.jsonl --profile cpu-host": Small(),
    "dattn plan --impl ImprovedDilatedAttention --seq-len 256k --json - | python -m json.tool": Small(
        expect=r"^\{\s*$"
    ),
    "dattn profile --impl ImprovedDilatedAttention --seq-len 16k --trace trace.json": Small(
        set={"--seq-len": "1k"}, add=PROFILE_SMALL, files=("trace.json",), why="N = 1k, two calls per setting"
    ),
    "dattn verify --world-size 1,2,4": Small(
        set={"--world-size": "1,2"},
        add=("--impl", "RingDilatedAttention", *ONE_CASE_SET),
        expect=r"verify passed",
        why="p = 1, 2, one distributed implementation, longnet, causal (all of them at p = 1, 2, 4: ~5 minutes)",
    ),
    "torchrun --nproc_per_node 2 examples/head_parallel_torchrun.py": Small(expect=r"rank 1/2"),
    "torchrun --nproc_per_node 2 examples/ring_multihead_torchrun.py": Small(expect=r"formula matches"),
    "dattn bench --impl RingDilatedAttention --world-size 4 --seq-len 16k": Small(
        set={"--world-size": "2", "--seq-len": "2k"}, add=BENCH_SMALL, why="2 ranks at N = 2k"
    ),
    "python benchmarks/distributed_memory.py": Small(
        add=("--seq-len", "2k", "--world-size", "2", "--repeat", "1", "--mode", "fwd"),
        files=("results/distributed_memory-*.jsonl",),
        why="the script's smallest run: N = 2k, p = 2 vs 1, forward (the default, N = 64k at p = 4, takes minutes)",
    ),
    "dattn verify --impl BlockSparseRingDilatedAttention --pattern local --pattern longnet": Small(
        add=ONE_CASE_SET, expect=r"verify passed", why="longnet, causal only"
    ),
    "dattn bench --impl BlockSparseRingDilatedAttention --impl sdpa --pattern local --density 0.05,0.1,0.25 "
    "--seq-len 8k --plot d.png": Small(
        set={"--seq-len": "1k", "--density": "0.1,0.25"},
        add=BENCH_SMALL,
        files=("d.png",),
        why="N = 1k (8 blocks), two densities",
    ),
    "dattn profile --impl BlockSparseRingDilatedAttention --pattern hierarchical --window 2 "
    "--show-pattern pattern.png": Small(
        add=("--seq-len", "2k", *PROFILE_SMALL), files=("pattern.png",), why="N = 2k, two calls per setting"
    ),
    "python benchmarks/block_sparse.py": Small(
        add=("--seq-len", "2k", "--repeat", "1", "--no-flex"),
        files=("results/block_sparse-*.png",),
        why="the script's smallest run: N = 2k, one timed call, no FlexAttention compile (the default takes minutes)",
    ),
    "dattn bench --target layer --embed-dim 768 --heads 12 --causal --seq-len 4k,8k --checkpointing --amp bf16": Small(
        set={"--embed-dim": "64", "--heads": "2", "--seq-len": "1k"},
        add=BENCH_SMALL,
        why="a 64-wide block at N = 1k: bf16 autocast of the 768-wide block takes ~25 s a call on CPUs without "
        "native bf16",
    ),
    "dattn bench --target model --layers 12 --embed-dim 768 --heads 12 --until-oom --start-seq-len 1k "
    "--max-memory 3GiB": Small(
        set={"--layers": "1", "--embed-dim": "64", "--heads": "2", "--max-memory": "64MiB"},
        add=("--vocab-size", "256", *BENCH_SMALL),
        why="a one-layer 64-wide model under a 64 MiB cap: the search ends at its first point (a step of the "
        "125M model takes 10-30 s on CPU)",
    ),
    "dattn plan --target model --layers 12 --embed-dim 768 --heads 12 --profile h100-sxm-80gb "
    "--checkpointing --amp bf16 --max-seq": Small(expect=r"largest N"),
    "python benchmarks/layer_claims.py --cap 3GiB": Small(
        set={"--cap": "1GiB"},
        add=("--seq-len", "512", "--options", "plain"),
        why="the script's smallest run: the plain and dense blocks at N = 512; under a 1 GiB cap the 125M model's "
        "search ends before measuring (its weights and AdamW state alone are ~2 GiB); the planner part as is",
    ),
    "dattn profiles list": Small(expect=r"cpu-host"),
    "dattn plan --impl RingDilatedAttention --profile h100-sxm-80gb --seq-len 4m --world-size 8 "
    "--dtype bfloat16": Small(expect=r"verdict"),
    "dattn plan --profile cpu-host --max-seq --max-memory 2GiB --mode fwd": Small(expect=r"largest N"),
    "dattn env": Small(expect=r"torch"),
    "echo 'verify: {semantics: longnet, causal: true}' > opts.yaml": Small(files=("opts.yaml",)),
    "dattn --config opts.yaml verify --impl ImprovedDilatedAttention": Small(expect=r"verify passed"),
    "python benchmarks/single_device.py": Small(
        add=("--fwd-n", "1024", "--fwdbwd-n", "1024", "--repeat", "1", "--heads", "2", "--no-memory"),
        expect=r"Improved / Dilated",
        why="the script's smallest run: N = 1k, one round, 2 heads, time only (the targets, N = 32k/16k with "
        "memory measured in ten spawned processes, take minutes)",
    ),
}


# --- reading the README ----------------------------------------------------------------------------------


def tour_block(text: str) -> list[str]:
    """The command lines of the README's "A short tour" bash block."""
    section = text.split("## A short tour", 1)
    assert len(section) == 2, "README.md has no '## A short tour' section"
    block = re.search(r"```bash\n(.*?)```", section[1], re.S)
    assert block, "the README's tour has no ```bash block"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]


def tokens(line: str) -> list[str]:
    """Shell words and operators of `line`, its comment dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def render(words: list[str]) -> str:
    return " ".join(w if w in OPERATORS else shlex.quote(w) for w in words)


def key(line: str) -> str:
    return render(tokens(line))


LINES = tour_block(README.read_text())


# --- making a line small -----------------------------------------------------------------------------------


def small_command(line: str, small: Small) -> str:
    """The line with the entry's replacements and additions, script paths pointing into the checkout."""
    words = tokens(line)
    end = next((i for i, w in enumerate(words) if w in OPERATORS), len(words))
    head, tail = words[:end], words[end:]
    for option, value in small.set.items():
        at = [i for i, w in enumerate(head) if w == option]
        assert at, f"TOUR entry replaces {option}, which the README line does not have: {line}"
        for i in at:
            head[i + 1] = value
    head += small.add
    return render([in_checkout(w) for w in head + tail])


def in_checkout(word: str) -> str:
    if re.match(r"(examples|benchmarks)/\S+\.py$", word):
        assert (ROOT / word).is_file(), f"the README runs {word}, which is not in the checkout"
        return str(ROOT / word)
    return word


# --- the tests ---------------------------------------------------------------------------------------------


def test_tour_is_found():
    assert len(LINES) >= 20, f"the README's tour has {len(LINES)} lines; the parser lost some"
    assert all(tokens(line) for line in LINES)


def test_every_tour_line_has_an_entry():
    keys = [key(line) for line in LINES]
    missing = [k for k in keys if k not in TOUR]
    unused = [k for k in TOUR if k not in keys]
    assert not missing, "README tour lines without a TOUR entry in tests/test_readme.py (add one each):\n" + "\n".join(
        f"    {k!r}: Small(...)," for k in missing
    )
    assert not unused, "TOUR entries whose line is no longer in the README (remove or update them):\n" + "\n".join(
        unused
    )


def test_entries_apply_to_their_lines():
    for line in LINES:
        small = TOUR.get(key(line))
        if small is None:
            continue  # reported by test_every_tour_line_has_an_entry
        small_command(line, small)  # every replaced option is in the line
        assert small.why or not (small.set or small.add), f"say why the CI run of this line differs: {line}"


@pytest.fixture(scope="module")
def tour_dir(tmp_path_factory) -> Path:
    """The directory the tour runs in, with bin/ shims: dattn, python and torchrun of this interpreter."""
    root = tmp_path_factory.mktemp("tour")
    bin_dir = root / ".bin"
    bin_dir.mkdir()
    shims = {"dattn": "-m dattn_cli", "python": "", "python3": "", "torchrun": "-m torch.distributed.run"}
    for name, module in shims.items():
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {module} "$@"\n')
        shim.chmod(0o755)
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_line(command: str, cwd: Path, timeout: int) -> tuple[int, str]:
    env = {
        **os.environ,
        "PATH": f"{cwd / '.bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "PET_MASTER_PORT": str(free_port()),
        "MPLBACKEND": "Agg",
        "COLUMNS": "160",
    }
    proc = subprocess.Popen(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the line's whole process group: workers, ranks, forkserver
        out, _ = proc.communicate()
        pytest.fail(f"timed out after {timeout} s: {command}\n{out[-3000:]}")
    return proc.returncode, out


def line_id(line: str) -> str:
    words = [w for w in tokens(line) if w not in OPERATORS][:4]
    return "-".join(re.sub(r"[^A-Za-z0-9_.,]+", "", Path(w).name) for w in words)


@pytest.mark.slow
@pytest.mark.parametrize("line", LINES, ids=[f"{i:02d}-{line_id(line)}" for i, line in enumerate(LINES)])
def test_tour_line(line: str, tour_dir: Path):
    small = TOUR.get(key(line))
    assert small is not None, f"no TOUR entry for this README line (see test_every_tour_line_has_an_entry): {line}"
    command = small_command(line, small)
    code, out = run_line(command, tour_dir, small.timeout)
    assert code in small.exit_codes, f"exit {code}: {command}\n{out[-4000:]}"
    assert "is deprecated" not in out, f"the README uses a deprecated option name: {line}\n{out[-2000:]}"
    if small.expect:
        assert re.search(small.expect, out, re.M), f"output lacks {small.expect!r}: {command}\n{out[-4000:]}"
    for pattern in small.files:
        assert glob.glob(str(tour_dir / pattern)), f"{pattern} not written: {command}\n{out[-4000:]}"
