"""Typed results across the process boundary (runtime/launch.py `result=`): a worker's result is validated on
arrival, so a malformed one becomes an error row naming the fault, and a good one arrives as the model."""

from dattn_cli.bench.point import PointResult
from dattn_cli.runtime.launch import run_isolated


def good_child(conn):
    conn.send({"status": "ok", "time_ms": 1.5, "samples_ms": [1.5]})
    conn.close()


def malformed_child(conn):
    conn.send({"status": "ok", "time_msec": 1.5})  # a misspelt field
    conn.close()


def test_a_result_arrives_validated_as_its_model():
    result = run_isolated(good_child, (), deadline_s=120, result=PointResult)
    assert isinstance(result, PointResult) and result.time_ms == 1.5
    assert result.model_dump(exclude_unset=True) == {"status": "ok", "time_ms": 1.5, "samples_ms": [1.5]}


def test_a_malformed_result_is_an_error_naming_it():
    result = run_isolated(malformed_child, (), deadline_s=120, result=PointResult)
    assert result["status"] == "error" and result["reason"] == "malformed worker result", result
    assert "PointResult" in result["error"]
