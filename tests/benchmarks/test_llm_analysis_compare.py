"""benchmarks/llm_analysis_compare.py: llm-analysis's formulas as re-implemented, and the printed table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import llm_analysis_compare as cmp  # noqa: E402

from dattn_cli.plan.profiles import load_profile  # noqa: E402


def analysis(config: cmp.Config) -> cmp.LLMAnalysis:
    return cmp.LLMAnalysis(config, load_profile(config.profile), 0.5)


def test_the_reimplemented_formulas():
    seven_b = cmp.CONFIGS[1]  # ZeRO-3 over 8
    la = analysis(seven_b)
    params = 32 * (12 * 4096**2 + 2 * 4096) + 50304 * 4096 + 4096
    assert la.params_total() == params
    assert la.weights() == 2 * params / 8 and la.optimizer_states() == 12 * params / 8
    assert la.gradients() == 4 * params / 8  # gradients at the master weights' 4 bytes, sharded from ZeRO-2
    t, v = 4096, 50304
    assert la.logits() == 2 * t * v
    # the logits are in the activations and again as the loss's backward memory
    assert la.peak() == la.optimizer_states() + la.weights() + max(la.activations(), la.gradients()) + max(
        4 * (12 * 4096**2 + 2 * 4096), la.logits()
    )
    ddp = analysis(cmp.CONFIGS[3])
    assert ddp.weights() == 2 * params and ddp.optimizer_states() == 12 * params


def test_compare_prints_every_configuration(capsys):
    cmp.main()
    out = capsys.readouterr().out
    for config in cmp.CONFIGS:
        assert config.name in out
    assert out.count("| peak per device") == len(cmp.CONFIGS)
    rows = {name: (ours, theirs) for name, ours, theirs in cmp.compare(cmp.CONFIGS[1])}
    assert rows["weights"][0] == pytest.approx(rows["weights"][1], rel=1e-3)
    assert rows["gradients"][0] == pytest.approx(rows["gradients"][1] / 2, rel=1e-3)  # 2 against 4 bytes
