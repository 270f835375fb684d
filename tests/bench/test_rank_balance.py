"""Per-rank time of distributed bench rows: each rank's own median call time (rank_time_ms; CPU: its process CPU
time) and their max/mean (rank_time_max_over_mean), in the table, the --out/--json/--csv records."""

import csv
import json

import pytest

from dattn_cli.bench import read_rows
from dattn_cli.bench.worker import _combine_ranks
from tests.cli.test_verify_env import run_cli


def test_ranks_combine_into_their_own_times_and_max_over_mean():
    per_rank = [
        {"time_ms": 12.0, "peak_mem_bytes": 5, "rank_time_ms": [6.0], "comm_bytes_sent": 1, "comm_bytes_received": 1},
        {"time_ms": 12.5, "peak_mem_bytes": 7, "rank_time_ms": [12.0], "comm_bytes_sent": 2, "comm_bytes_received": 2},
    ]
    row = _combine_ranks(per_rank)
    assert row["time_ms"] == 12.5 and row["rank_time_ms"] == [6.0, 12.0]
    assert row["rank_time_max_over_mean"] == pytest.approx(12.0 / 9.0)


@pytest.mark.slow
def test_bench_world_size_2_reports_rank_time_max_over_mean(tmp_path, capsys):
    out, as_json, as_csv = tmp_path / "r.jsonl", tmp_path / "r.json", tmp_path / "r.csv"
    args = ["bench", "--impl", "RingDilatedAttention", "--world-size", "2", "--seq-len", "256", "--causal"]
    args += ["--heads", "2", "--head-dim", "16", "--segments", "256", "--dilations", "1", "--repeat", "3"]
    code, stdout, err = run_cli([*args, "--out", str(out), "--json", str(as_json), "--csv", str(as_csv)], capsys)
    assert code == 0, err
    assert "rank max/mean" in stdout
    (row,) = read_rows(out)
    assert row.status == "ok" and len(row.rank_time_ms) == 2 and all(t > 0 for t in row.rank_time_ms)
    mean = sum(row.rank_time_ms) / 2
    assert row.rank_time_max_over_mean == pytest.approx(max(row.rank_time_ms) / mean)
    assert 1.0 <= row.rank_time_max_over_mean < 2.0
    text = as_json.read_text()
    assert "rank_time_max_over_mean" in text and json.loads(text)
    (record,) = list(csv.DictReader(as_csv.open()))
    assert float(record["rank_time_max_over_mean"]) == pytest.approx(row.rank_time_max_over_mean)
