"""plan --model and --model-config: the model's name, source and architecture in the table and the JSON, and bad
input in one line with exit 2."""

import json

import pytest

from tests.cli.test_verify_env import run_cli

PLAN = ["plan", "--profile", "h100-sxm-80gb", "--seq-len", "8k", "--dtype", "bfloat16"]


def test_plan_a_preset_over_devices(tmp_path, capsys):
    out = tmp_path / "p.json"
    code, stdout, err = run_cli(
        [*PLAN, "--model", "llama-3.1-8b", "--devices", "8", "--zero", "3", "--json", str(out)], capsys
    )
    assert code == 0, err
    assert "llama-3.1-8b" in stdout and "8,030,261,248 parameters" in stdout and "huggingface.co" in stdout
    data = json.loads(out.read_text())
    problem = data["problem"]
    assert problem["target"] == "model" and problem["impl"] == "sdpa"
    assert (problem["layers"], problem["embed_dim"], problem["heads"], problem["kv_heads"]) == (32, 4096, 32, 8)
    arch = problem["architecture"]
    assert arch["name"] == "llama-3.1-8b" and arch["intermediate_size"] == 14336 and arch["mlp"] == "swiglu"
    assert arch["source"].startswith("https://huggingface.co/meta-llama/") and not arch["tie_word_embeddings"]


def test_plan_a_config_file(tmp_path, capsys):
    path = tmp_path / "config.json"
    config = {"model_type": "qwen2", "hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8}
    path.write_text(json.dumps({**config, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000}))
    code, stdout, err = run_cli([*PLAN, "--model-config", str(path), "--json", "-"], capsys)
    assert code == 0, err
    arch = json.loads(stdout)["problem"]["architecture"]
    assert arch["family"] == "qwen2" and arch["attention_bias"] == "qkv" and arch["source"] == str(path)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "llama-9"], "use one of llama-2-7b, llama-3.1-405b"),
        (["--model", "llama-3.1-8b", "--layers", "4"], "drop --layers"),
        (["--model", "llama-3.1-8b", "--heads", "8", "--vocab-size", "10"], "drop --heads, --vocab-size"),
        (["--model", "llama-3.1-8b", "--target", "attention"], "drop --target attention"),
        (["--model", "llama-3.1-8b", "--impl", "ImprovedMultiheadDilatedAttention"], "own q/k/v/o projections"),
        (["--model", "llama-3.1-8b", "--devices", "2", "--sequence-parallel", "2", "--sp-kind", "x"], "--sp-kind"),
        (["--model", "mistral-7b", "--model-config", "c.json"], "give one"),
        (["--model-config", "/nonexistent/config.json"], "cannot read"),
    ],
)
def test_bad_model_input_is_one_line(args, message, capsys):
    code, _, err = run_cli([*PLAN, *args], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_refused_config_names_the_field(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mixtral", "num_local_experts": 8}))
    code, _, err = run_cli([*PLAN, "--model-config", str(path)], capsys)
    assert code == 2 and "model_type" in err and len(err.strip().splitlines()) == 1, err


def test_plan_a_tiled_mlp(capsys):
    args = [*PLAN, "--model", "llama-3.1-8b", "--mode", "fwdbwd", "--seq-len", "128k", "--devices", "8", "--zero", "3"]
    code, stdout, err = run_cli([*args, "--tiled-mlp", "--json", "-"], capsys)
    assert code == 0, err
    tiled = json.loads(stdout)
    assert tiled["problem"]["architecture"]["tiled_mlp"]
    code, stdout, err = run_cli([*args, "--json", "-"], capsys)
    untiled = json.loads(stdout)
    assert tiled["memory"]["total"] < untiled["memory"]["total"]
    assert tiled["time"]["total_s"] > untiled["time"]["total_s"]  # the MLP's forward runs twice
    code, _, err = run_cli(["plan", "--seq-len", "4096", "--tiled-mlp"], capsys)
    assert code == 2 and "--model or --model-config" in err and len(err.strip().splitlines()) == 1, err
