"""plan --search (plan/search.py): every layout planned, those that fit ranked by tokens/s per device."""

import json

import pytest

from dattn_cli.plan import solve
from dattn_cli.plan.parallel import Training
from dattn_cli.plan.profiles import load_profile
from dattn_cli.plan.search import layout_problem, layouts, search
from dattn_cli.workload import Problem
from dattn_cli.workload.model_presets import load_preset
from tests.cli.test_verify_env import run_cli

H100 = load_profile("h100-sxm-80gb")


def llama8b(n: int) -> Problem:
    fields = {"impl": "sdpa", "target": "model", "seq_len": n, "dtype": "bfloat16", "mode": "fwdbwd"}
    return Problem(**{**fields, **load_preset("llama-3.1-8b")})


def test_layouts_cover_the_dimensions_and_skip_the_impossible():
    found = list(layouts(llama8b(65536), 16, 8, host=True))
    assert {r.tensor_parallel for r in found} == {1, 2, 4, 8}  # 8 kv heads, 8 a node
    assert {r.sequence_parallel for r in found} == {1, 2, 4, 8, 16}
    assert {r.sp_kind for r in found} == {None, "ring", "allgather", "head_parallel", "hybrid"}
    assert all(r.tensor_parallel * r.sequence_parallel <= 16 for r in found)
    assert not any("activations" in r.offload and r.recompute != "full" for r in found)
    assert not any("optimizer" in r.offload and r.zero == 0 for r in found)
    assert not any(r.offload for r in layouts(llama8b(65536), 16, 8, host=False))


@pytest.fixture(scope="module")
def searched():
    return search(llama8b(262144), H100, 16, 4 << 20, solve.plan)


def test_every_ranked_layout_is_its_own_plan_and_fits(searched):
    assert searched.considered == searched.refused + searched.not_fitting + len(searched.ranked)
    rates = [r.tokens_per_s_per_device for r in searched.ranked]
    assert rates == sorted(rates, reverse=True) and len(rates) > 10
    for row in searched.ranked[:: max(1, len(searched.ranked) // 7)]:
        s = layout_problem(llama8b(262144), row.layout)
        training = Training(devices=16, global_batch_tokens=4 << 20, **row.layout.model_dump(exclude={"sp_kind"}))
        plan = solve.plan(s, H100, training=training)
        assert plan.feasible and plan.memory.total <= H100.memory_bytes
        assert plan.tokens_per_s_per_device == pytest.approx(row.tokens_per_s_per_device)
        assert plan.mfu == pytest.approx(row.mfu) and plan.peak_bytes == row.peak_bytes


def test_each_loser_says_why(searched):
    first, *rest = searched.ranked
    assert first.why == "" and all(r.why for r in rest)
    ring = next(r for r in rest if r.layout.sp_kind == "ring")
    if first.layout.sp_kind not in ("ring", "allgather"):
        assert "attention +" in ring.why and "of the kernel's rate" in ring.why


def test_cli_search_json_and_refusals(capsys):
    args = ["plan", "--model", "llama-3.1-8b", "--profile", "h100-sxm-80gb", "--dtype", "bfloat16"]
    args += ["--devices", "16", "--seq-len", "128k", "--global-batch-tokens", "2M", "--search"]
    code, out, err = run_cli([*args, "--json", "-"], capsys)
    assert code == 0, err
    data = json.loads(out)
    best = data["ranked"][0]
    assert {"peak_bytes", "tokens_per_s_per_device", "mfu", "mfu_megatron", "why"} <= set(best)
    assert data["global_batch_tokens"] == 2 << 20 and data["considered"] > len(data["ranked"]) > 0
    for extra, message in (
        (["--zero", "3"], "--search varies the layout itself: drop --zero"),
        (["--max-seq"], "drop --max-seq"),
    ):
        code, _, err = run_cli([*args, *extra], capsys)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    code, _, err = run_cli([a for a in args if a not in ("--global-batch-tokens", "2M")], capsys)
    assert code == 2 and "give --model and --global-batch-tokens" in err
