"""--kv-heads (GQA/MQA) and --documents (packed documents) on verify, bench and plan: the option reaches the
modules, rows carry it, and bad values get one line naming the option and the fix (exit 2)."""

import json

from dattn_cli.bench import read_rows
from tests.cli.test_verify_env import run_cli

SHAPE = ["--heads", "4", "--head-dim", "8", "--segments", "16,32", "--dilations", "1,2"]


def test_verify_your_configuration_with_kv_heads_and_documents(tmp_path, capsys):
    out = tmp_path / "v.json"
    code, stdout, err = run_cli(
        [
            "verify",
            "--impl",
            "ImprovedDilatedAttention",
            "--impl",
            "RingDilatedAttention",
            *SHAPE,
            "--kv-heads",
            "1",
            "--documents",
            "7,30,1,40,18",
            "--both",
            "--json",
            str(out),
        ],
        capsys,
    )
    assert code == 0, stdout + err
    results = json.loads(out.read_text())["results"]
    assert results and all(r["kv_heads"] == 1 and r["seq_len"] == 96 and r["passed"] for r in results)
    assert "H=4 H_kv=1" in stdout


def test_bench_kv_heads_and_documents_are_row_fields(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    code, stdout, err = run_cli(
        [
            "bench",
            "--impl",
            "ImprovedDilatedAttention",
            *SHAPE,
            "--kv-heads",
            "2",
            "--documents",
            "100,20,8",
            "--repeat",
            "2",
            "--out",
            str(out),
        ],
        capsys,
    )
    assert code == 0, err
    (row,) = read_rows(out)
    assert (row.status, row.kv_heads, row.documents, row.seq_len) == ("ok", 2, [100, 20, 8], 128)
    assert "H=4 H_kv=2" in stdout


def test_plan_kv_heads_counts_the_kv_inputs(capsys):
    code, stdout, _ = run_cli(["plan", "--seq-len", "64k", "--kv-heads", "2", "--json", "-"], capsys)
    assert code == 0
    plan = json.loads(stdout)
    items = plan["memory"]["items"]
    x = 65536 * 8 * 64 * 4  # one (B, N, H, D) float32 tensor
    assert plan["problem"]["kv_heads"] == 2
    assert items["inputs q, k, v"] == x + 2 * x // 4 and items["k, v repeated to H heads (GQA)"] == 2 * x


def test_bad_kv_heads_and_documents_are_one_line_exit_2(capsys):
    for args, message in (
        (["--kv-heads", "3"], "--kv-heads 3 does not divide --heads 4"),
        (["--documents", "10,20", "--seq-len", "64"], "--documents sum to 30 tokens but --seq-len is 64"),
        (["--documents", "10,0"], "--documents takes document lengths >= 1"),
        (["--documents", "32,32", "--batch", "2"], "--documents packs one sequence: use --batch 1"),
    ):
        code, _, err = run_cli(["verify", *SHAPE, *args], capsys)
        assert code == 2 and message in err and "Traceback" not in err, err
    code, _, err = run_cli(["bench", "--impl", "sdpa", *SHAPE, "--documents", "30,34", "--repeat", "2"], capsys)
    assert code == 2 and "--documents applies to the attention implementations" in err


def test_plan_documents_counts_flops_per_document_and_the_longest_working_set(capsys):
    code, stdout, _ = run_cli(["plan", "--documents", "4096,4096,8192", "--json", "-"], capsys)
    assert code == 0
    docs = json.loads(stdout)
    code, stdout, _ = run_cli(["plan", "--seq-len", "16384", "--json", "-"], capsys)
    whole = json.loads(stdout)
    assert docs["problem"]["documents"] == [4096, 4096, 8192] and docs["problem"]["seq_len"] == 16384
    # each document attends only itself: fewer pairs than one 16k sequence (segments up to 8192 split the same
    # way here, so only the 8192-segment's pairs differ), and the engine's working set is the 8k document's
    assert docs["time"]["flops"] < whole["time"]["flops"]
    assert any("8,192 positions" in name for name in docs["memory"]["items"])
    code, _, err = run_cli(["plan", "--documents", "10,20", "--max-seq"], capsys)
    assert code == 2 and "--documents fix N" in err
