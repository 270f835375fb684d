"""Model shapes from Hugging Face transformers config.json files: the presets shipped as package data
(model_presets/*.yaml at the repository root, `dattn_cli.model_presets` in a wheel; `plan --model NAME`) and
the user's own file (`plan --model-config PATH`). Both go through one reader, `from_hf_config`, into the
Problem's fields: the sizes (embed_dim, heads, kv_heads, head_dim, layers, vocab_size) and an Architecture.

Honoured: hidden_size, intermediate_size, num_attention_heads, num_key_value_heads (default: the heads),
head_dim (default hidden_size / heads), num_hidden_layers, vocab_size, tie_word_embeddings (default false, as
LlamaConfig, MistralConfig and Qwen2Config have it), hidden_act (silu/swish: SwiGLU; a gelu: the same gated MLP
with GELU), attention_bias (llama, qwen3: q, k, v and o; qwen2 has q, k, v biases by its model_type; mistral none;
qwen3 adds RMSNorms of each head's queries and keys) and llama's mlp_bias. Refused, in one line naming the field:
another model_type, mixture-of-experts fields, a sliding window where it applies (qwen2's and qwen3's
use_sliding_window true; mistral's sliding_window unless null, its default being 4096), and rope scaling types
other than the frequency rescalings (linear, dynamic, yarn, longrope, llama3), which change neither FLOPs nor
memory.
"""

from __future__ import annotations

import json
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from .architecture import Architecture
from .parse import clip
from .yaml_input import load_yaml

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")  # transformers model_types whose decoder layer plan/decoder.py models
MOE_FIELDS = (
    *("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size", "num_experts_per_tok"),
    *("n_shared_experts", "shared_expert_intermediate_size", "first_k_dense_replace", "decoder_sparse_step"),
)
ROPE_RESCALINGS = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")  # inv_freq only: same work
ACTIVATIONS = {"silu": "swiglu", "swish": "swiglu"} | {
    name: "geglu" for name in ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python")
}
MAX_CONFIG_BYTES = 1 << 20
PRESET_KEYS = {"name", "source", "read_from", "parameters", "note", "config"}


def shipped_folder() -> Traversable:
    """The presets: an installed wheel's package data dattn_cli/model_presets/, else model_presets/ at the
    repository root (a checkout), which pyproject.toml maps to that package data."""
    packaged = resources.files("dattn_cli") / "model_presets"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[2] / "model_presets"


def preset_files() -> dict[str, Traversable]:
    found = [f for f in shipped_folder().iterdir() if f.name.endswith(".yaml")]
    return {f.name.removesuffix(".yaml"): f for f in sorted(found, key=lambda f: f.name)}


def load_preset(name: str) -> dict[str, Any]:
    """The Problem fields of a shipped preset; an unknown name is refused listing the known ones."""
    files = preset_files()
    if name not in files:
        raise ValueError(f"--model {clip(name)} is unknown: use one of {', '.join(files)}")
    data = load_yaml(files[name].read_text(), f"--model {name}")
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict) or set(data) - PRESET_KEYS:
        raise ValueError(f"--model {name}: the preset file is malformed (keys: {', '.join(sorted(PRESET_KEYS))})")
    return from_hf_config(data["config"], f"--model {name}", name, str(data.get("source", "")))


def read_config(path: Path) -> dict[str, Any]:
    """The Problem fields of a transformers config.json on disk (json only; transformers is not needed)."""
    where = f"--model-config {path}"
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ValueError(f"{where}: more than {MAX_CONFIG_BYTES:,} bytes; is it a config.json?")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: cannot read it ({clip(getattr(exc, 'strerror', None) or exc)})") from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{where}: not JSON ({clip(getattr(exc, 'msg', exc))})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: not a JSON object of config fields")
    data = data.get("text_config", data) if isinstance(data.get("text_config"), dict) else data
    return from_hf_config(data, where, str(data.get("_name_or_path") or path.stem), str(path))


def _integer(config: dict, key: str, where: str, default: int | None = None) -> int:
    value = config.get(key)
    value = default if value is None else value
    if value is None:
        raise ValueError(f"{where}: {key} is missing; a transformers config.json of the model gives it")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: {key} must be a whole number >= 1, got {clip(json.dumps(value))}")
    return value


def _flag(config: dict, key: str, where: str) -> bool:
    value = config.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ValueError(f"{where}: {key} must be true or false, got {clip(json.dumps(value))}")
    return value


def _refusals(config: dict, family: str, where: str) -> None:
    """Mixture of experts, a sliding window that applies, and rope scalings that change the computation."""
    for key in MOE_FIELDS:
        if config.get(key) not in (None, 0, False):
            raise ValueError(f"{where}: {key} makes it a mixture-of-experts model, which dattn does not plan yet")
    window = config.get("sliding_window", 4096 if family == "mistral" else None)  # MistralConfig's default
    qwen = family in ("qwen2", "qwen3")
    if (family == "mistral" and window is not None) or (qwen and config.get("use_sliding_window")):
        field = "use_sliding_window" if qwen else "sliding_window"
        raise ValueError(
            f"{where}: {field} (a sliding window of {clip(json.dumps(window))} tokens) changes the attention; "
            "dattn plans dense causal attention: use a config without it"
        )
    for key in ("rope_scaling", "rope_parameters"):
        rope = config.get(key)
        if rope is None:
            continue
        kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else rope
        if kind not in ROPE_RESCALINGS:
            raise ValueError(
                f"{where}: {key} type {clip(json.dumps(kind))} is not one dattn plans: it takes "
                f"{', '.join(ROPE_RESCALINGS)} (they rescale the rotary frequencies only)"
            )


def from_hf_config(config: dict, where: str, name: str, source: str) -> dict[str, Any]:
    """The Problem fields of a transformers config (module docstring)."""
    family = config.get("model_type")
    if family not in FAMILIES:
        raise ValueError(
            f"{where}: model_type {clip(json.dumps(family))} is not planned; dattn plans the decoder layers of "
            f"{', '.join(FAMILIES)}"
        )
    _refusals(config, family, where)
    width, heads = _integer(config, "hidden_size", where), _integer(config, "num_attention_heads", where)
    if "head_dim" not in config and width % heads:
        raise ValueError(f"{where}: hidden_size {width} is not divisible by num_attention_heads {heads}: give head_dim")
    act = config.get("hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise ValueError(f"{where}: hidden_act {clip(json.dumps(act))} is not planned: use silu, swish or a gelu")
    bias = _flag(config, "attention_bias", where)
    architecture = Architecture(
        name=name,
        source=source,
        family=family,
        intermediate_size=_integer(config, "intermediate_size", where),
        mlp=ACTIVATIONS[act],
        tie_word_embeddings=_flag(config, "tie_word_embeddings", where),
        attention_bias="qkv" if family == "qwen2" else "qkvo" if bias and family in ("llama", "qwen3") else "none",
        qk_norm=family == "qwen3",
        mlp_bias=_flag(config, "mlp_bias", where) and family == "llama",
    )
    return dict(
        architecture=architecture,
        embed_dim=width,
        heads=heads,
        kv_heads=_integer(config, "num_key_value_heads", where, heads),
        head_dim=_integer(config, "head_dim", where, width // heads),
        layers=_integer(config, "num_hidden_layers", where),
        vocab_size=_integer(config, "vocab_size", where),
    )
