"""The model's loss in the planner (plan/loss.py): the standard loss's whole logits against the chunked loss's one
chunk, Liger's chunk rule, and `plan --loss`."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dattn_cli.plan import solve
from dattn_cli.plan.loss import chunk_rows, loss_items
from dattn_cli.plan.parallel import Training
from dattn_cli.plan.profiles import load_profile
from dattn_cli.workload import Problem
from dattn_cli.workload.model_presets import load_preset
from tests.cli.test_verify_env import run_cli

H100 = load_profile("h100-sxm-80gb")


def llama(seq_len: int, **overrides) -> Problem:
    fields = dict(impl="sdpa", target="model", seq_len=seq_len, dtype="bfloat16", mode="fwdbwd", checkpointing=True)
    return Problem(**{**fields, **load_preset("llama-3.1-8b"), **overrides})


def test_chunks_follow_liger_rule():
    """liger_kernel/ops/fused_linear_cross_entropy.py's own example: BT = 4096 x 4, V = 32000, H = 4096: 2048 rows."""
    s = Problem(impl="ImprovedMultiheadDilatedAttention", target="model", batch=4, seq_len=4096, embed_dim=4096)
    s = s.model_copy(update={"vocab_size": 32000})
    assert chunk_rows(s) == 2048
    assert chunk_rows(s.model_copy(update={"batch": 1, "seq_len": 100})) == 16  # next power of 2 of ceil(100 / 8)
    assert chunk_rows(s.model_copy(update={"vocab_size": 1000})) == 16384  # V <= E: one chunk of every row


def test_chunked_loss_holds_one_chunk_of_logits_not_all():
    s = llama(131072)
    tokens, vocab, width = 131072, 128256, 4096
    standard, chunked = (sum(loss_items(s, how, train=True).values()) for how in ("standard", "chunked"))
    assert standard == 12 * tokens * vocab
    rows = chunk_rows(s)  # ceil(V / E) = 32 chunks of 4096 rows
    assert rows == 4096
    assert chunked == rows * vocab * 2 + tokens * width * 2 + vocab * width * 2 + 4 * tokens
    assert chunked < standard / 10


def test_at_long_context_the_chunked_loss_takes_the_logits_off_the_peak():
    s = llama(40960)
    layout = dict(devices=8, zero=3, recompute="full")
    standard = solve.plan(s, H100, training=Training(**layout))
    chunked = solve.plan(s, H100, training=Training(**layout, loss="chunked"))
    assert not standard.fits and chunked.fits
    assert standard.memory.phase == "loss backward (logits)"  # the logits decide the peak
    assert chunked.memory.total < standard.memory.total - 30 * 2**30
    assert chunked.memory.phase != "loss backward (logits)"
    assert chunked.time.total_s == pytest.approx(standard.time.total_s)  # the same FLOPs: memory only


def test_forward_only_holds_one_chunk_too():
    s = llama(65536, mode="fwd", checkpointing=False)
    standard = sum(loss_items(s, "standard", train=False).values())
    chunked = loss_items(s, "chunked", train=False)
    assert standard == 65536 * 128256 * (2 + 4 + 4)  # half logits, their fp32 copy, log-softmax
    # one chunk's logits, the input gradient Liger allocates in every mode, the per-token loss
    assert sum(chunked.values()) == chunk_rows(s) * 128256 * 2 + 65536 * 4096 * 2 + 4 * 65536


def test_plan_loss_option(capsys):
    args = ["plan", "--profile", "h100-sxm-80gb", "--model", "llama-3.1-8b", "--seq-len", "32k", "--dtype", "bfloat16"]
    code, stdout, err = run_cli([*args, "--mode", "fwdbwd", "--loss", "chunked", "--json", "-"], capsys)
    assert code == 0, err
    data = json.loads(stdout)
    assert data["training"]["loss"] == "chunked"
    assert not any("log-softmax" in item for item in data["memory"]["items"])
    code, _, err = run_cli(["plan", "--seq-len", "4096", "--loss", "chunked"], capsys)
    assert (
        code == 2
        and "--dp-shard, --recompute selective, --global-batch-tokens and --search apply to --target model" in err
        and len(err.strip().splitlines()) == 1
    )
    code, _, err = run_cli([*args, "--loss", "tiled"], capsys)
    assert code == 2 and "--loss" in err and "chunked" in err


def test_compiled_loss_holds_the_logits_and_their_gradient():
    s = llama(65536)
    assert loss_items(s, "compiled", train=True) == {
        "logits and their gradient (compiled loss)": 2 * 2 * 65536 * 128256
    }
    assert sum(loss_items(s, "compiled", train=False).values()) == 2 * 65536 * 128256


PEAK_SCRIPT = """
import gc, sys, torch
T, V = 2048, 16384
def ce(pred, labels):
    return torch.nn.functional.cross_entropy(pred.float(), labels)
fn = torch.compile(ce) if sys.argv[1] == "compiled" else ce
labels = torch.randint(0, V, (T,))
def status(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))
for _ in range(2):  # the first compiled call compiles
    logits = torch.randn(T, V, dtype=torch.bfloat16, requires_grad=True)
    gc.collect()
    start = status("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")
    fn(logits, labels).backward()
    peak = (status("VmHWM") - start) / logits.numel()
    del logits
print(peak)
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak RSS reset needs Linux /proc")
@pytest.mark.parametrize("how, per_element", [("standard", 12.0), ("compiled", 2.0)])
def test_the_loss_bytes_are_what_torch_holds(how, per_element):
    """Beyond the live bf16 logits: eager cross_entropy(pred.float()) 12 bytes an element, compiled 2 (the gradient;
    the graph keeps the logits themselves): loss_items' 12 and 2·c less the logits' c."""
    if how == "compiled" and not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("torch.compile on a CPU needs a C++ compiler")
    mode = "eager" if how == "standard" else "compiled"
    done = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, mode], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) == pytest.approx(per_element, abs=0.5)
