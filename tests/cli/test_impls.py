"""`dattn impls`: the registry as a table and as JSON."""

import importlib.util
import json

import torch

from dattn_cli.kernels.registry import REGISTRY
from tests.cli.test_verify_env import run_cli


def test_impls_table_lists_every_registry_entry_and_why_flash_is_not_here(capsys):
    code, out, err = run_cli(["impls"], capsys)
    assert code == 0, err
    for name in REGISTRY:
        assert name in out
    text = " ".join(out.split())  # the caption may wrap
    if importlib.util.find_spec("flash_attn") is None:  # flash-attn not installed: the table says so, with the fix
        assert "flash: cuda: needs flash_attn: pip install 'dattn[flash]'" in text
    elif REGISTRY["flash"].unavailable("cuda"):
        assert f"flash: cuda: {REGISTRY['flash'].unavailable('cuda')}" in text


def test_impls_json_lists_the_registry_with_availability(capsys):
    code, out, err = run_cli(["impls", "--json", "-"], capsys)
    assert code == 0, err
    entries = json.loads(out)
    assert [e["name"] for e in entries] == list(REGISTRY)
    by_name = {e["name"]: e for e in entries}
    assert by_name["sdpa"]["baseline"] and not by_name["ImprovedDilatedAttention"]["baseline"]
    assert (
        by_name["ImprovedDilatedAttention"]["available"]
        and "cpu" in by_name["ImprovedDilatedAttention"]["available_on"]
    )
    assert by_name["RingDilatedAttention"]["where"] == REGISTRY["RingDilatedAttention"].where()
    if not torch.cuda.is_available():  # what each backend's blocks run on here (kernels/kernel_choice.py)
        assert by_name["ImprovedDilatedAttention"]["block_kernels"] == {"math": "math", "sdpa": "cpu-flash"}
        assert by_name["sdpa"]["block_kernels"] == {}
    flash = by_name["flash"]
    assert flash["devices"] == ["cuda"] and "cpu" not in flash["available_on"]
    reason = REGISTRY["flash"].unavailable("cuda")
    if reason:
        assert not flash["available"] and reason in flash["unavailable"]
        if "flash_attn" in reason:
            assert "pip install 'dattn[flash]'" in flash["unavailable"]
