"""Model presets and transformers config.json files (workload/model_presets.py): the shapes read, the parameter
counts against the published sizes and against transformers' own models, and every refusal in one line."""

import json

import pytest

from dattn_cli.plan.layers import model_parameters
from dattn_cli.workload import Problem
from dattn_cli.workload.model_presets import from_hf_config, load_preset, preset_files, read_config

PUBLISHED = {  # parameters as the model cards and the configs' safetensors indices give them
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "mistral-7b": 7_248_023_552,
    "qwen2.5-7b": 7_615_616_512,
    "llama-2-7b": 6_738_415_616,  # the fp16 checkpoint's 13,476,839,424 bytes less 8,192 of rotary buffers, / 2
}
LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
}


def model(fields: dict) -> Problem:
    return Problem(impl="sdpa", target="model", seq_len=1024, **fields)


def test_every_preset_is_shipped_with_its_source():
    assert set(preset_files()) >= {*PUBLISHED, "llama-3.1-405b", "qwen2.5-72b"}
    for name in preset_files():
        fields = load_preset(name)
        assert fields["architecture"].name == name and fields["architecture"].source.startswith(
            "https://huggingface.co/"
        )


@pytest.mark.parametrize("name, count", PUBLISHED.items())
def test_parameters_equal_the_published_sizes(name, count):
    assert model_parameters(model(load_preset(name))) == count


@pytest.mark.parametrize("name", sorted(PUBLISHED) + ["llama-3.1-405b", "qwen2.5-72b", "qwen2.5-14b", "qwen3-32b"])
def test_parameters_equal_transformers_models_built_on_the_meta_device(name):
    transformers = pytest.importorskip("transformers")
    import torch
    import yaml

    config = yaml.safe_load(preset_files()[name].read_text())["config"]
    with torch.device("meta"):
        built = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    assert model_parameters(model(load_preset(name))) == sum(p.numel() for p in built.parameters())


def test_defaults_of_a_config():
    fields = from_hf_config(LLAMA, "here", "tiny", "x.json")
    assert (fields["kv_heads"], fields["head_dim"]) == (4, 64)  # heads; hidden / heads
    a = fields["architecture"]
    assert (a.mlp, a.norm, a.tie_word_embeddings, a.attention_bias, a.mlp_bias) == (
        "swiglu",
        "rmsnorm",
        False,
        "none",
        False,
    )
    assert from_hf_config({**LLAMA, "hidden_act": "gelu_pytorch_tanh"}, "h", "t", "")["architecture"].mlp == "geglu"
    assert from_hf_config({**LLAMA, "attention_bias": True}, "h", "t", "")["architecture"].attention_bias == "qkvo"
    qwen = from_hf_config({**LLAMA, "model_type": "qwen2", "use_sliding_window": False}, "h", "t", "")
    assert qwen["architecture"].attention_bias == "qkv"  # Qwen2Attention's q, k, v biases, without the field
    gemma_like = from_hf_config({**LLAMA, "head_dim": 128, "num_key_value_heads": 1}, "h", "t", "")
    assert (gemma_like["head_dim"], gemma_like["kv_heads"]) == (128, 1)
    assert model(gemma_like).width == 256 and model(gemma_like).attention_width == 512  # D is not E / H
    for kind in ("linear", "dynamic", "yarn", "longrope", "llama3"):  # frequency rescalings: accepted
        from_hf_config({**LLAMA, "rope_scaling": {"rope_type": kind, "factor": 4.0}}, "h", "t", "")
    mistral = {**LLAMA, "model_type": "mistral", "sliding_window": None}
    assert from_hf_config(mistral, "h", "t", "")["architecture"].family == "mistral"


@pytest.mark.parametrize(
    "change, field",
    [
        ({"model_type": "gpt2"}, "model_type"),
        ({"num_local_experts": 8}, "num_local_experts"),
        ({"num_experts": 64}, "num_experts"),
        ({"n_routed_experts": 256}, "n_routed_experts"),
        ({"moe_intermediate_size": 1408}, "moe_intermediate_size"),
        ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 4096}, "use_sliding_window"),
        ({"model_type": "mistral", "sliding_window": 4096}, "sliding_window"),
        ({"model_type": "mistral"}, "sliding_window"),  # MistralConfig's default is 4096
        ({"rope_scaling": {"rope_type": "mrope"}}, "rope_scaling"),
        ({"hidden_act": "relu"}, "hidden_act"),
        ({"hidden_size": None}, "hidden_size"),
        ({"num_hidden_layers": "32"}, "num_hidden_layers"),
        ({"vocab_size": True}, "vocab_size"),
        ({"intermediate_size": 0}, "intermediate_size"),
        ({"tie_word_embeddings": "no"}, "tie_word_embeddings"),
        ({"hidden_size": 250}, "head_dim"),
    ],
)
def test_refusals_name_the_field(change, field):
    with pytest.raises(ValueError) as exc:
        from_hf_config({**LLAMA, **change}, "--model-config c.json", "t", "")
    message = str(exc.value)
    assert field in message and "\n" not in message and message.startswith("--model-config c.json")


def test_reading_a_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, "_name_or_path": "org/tiny"}))
    fields = read_config(path)
    assert fields["architecture"].name == "org/tiny" and fields["architecture"].source == str(path)
    for text, why in (("{nope", "not JSON"), ("[1, 2]", "not a JSON object")):
        path.write_text(text)
        with pytest.raises(ValueError, match=why):
            read_config(path)
    with pytest.raises(ValueError, match="cannot read"):
        read_config(tmp_path / "missing.json")


def test_an_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match="llama-3.1-8b") as exc:
        load_preset("llama-9")
    assert "--model llama-9 is unknown" in str(exc.value)


def test_a_named_model_refuses_what_its_block_cannot_take():
    fields = load_preset("llama-3.1-8b")
    with pytest.raises(ValueError, match="own q/k/v/o projections"):
        Problem(impl="ImprovedMultiheadDilatedAttention", target="model", **fields)
    with pytest.raises(ValueError, match="is a model"):
        Problem(impl="sdpa", target="attention", **fields)
    dilated = Problem(impl="ImprovedDilatedAttention", target="model", seq_len=8192, **fields)
    assert dilated.head_dim == 128 and model_parameters(dilated) == PUBLISHED["llama-3.1-8b"]


def test_the_seed_projects_1t_model_is_a_trillion_parameters():
    """docs/claims.md (e): the shape the seed's block-sparse study gives (E 32768, 128 layers, 128 heads), a SwiGLU
    MLP of 35,840 and a 128,256 vocabulary (our choices, stated there)."""
    from pathlib import Path

    fields = read_config(Path(__file__).resolve().parents[2] / "examples" / "seed_1t_config.json")
    assert model_parameters(model(fields)) == 1_009_141_186_560
