"""The planner's decoder block (plan/decoder.py) against transformers' own decoder layers and models: what autograd
saves, the peak of a layer's forward and backward, a model's training step, and the parameter counts."""

import pytest
import torch

from dattn_cli.plan import decoder
from dattn_cli.plan.layers import layer_memory, model_parameters
from dattn_cli.plan.memory import estimate_memory
from dattn_cli.runtime.measure import LiveTensorBytes
from dattn_cli.workload import Problem
from dattn_cli.workload.architecture import Architecture

transformers = pytest.importorskip("transformers")

E, H, D, F, N = 256, 4, 64, 688, 512
FAMILIES = {  # model_type: (config class, decoder layer, the planner's attention_bias)
    "llama": ("LlamaConfig", "LlamaDecoderLayer", "none"),
    "mistral": ("MistralConfig", "MistralDecoderLayer", "none"),
    "qwen2": ("Qwen2Config", "Qwen2DecoderLayer", "qkv"),
    "qwen3": ("Qwen3Config", "Qwen3DecoderLayer", "none"),
}


def hf_config(family: str, kv_heads: int, layers: int = 1, vocab: int = 100):
    config = getattr(transformers, FAMILIES[family][0])(
        hidden_size=E,
        intermediate_size=F,
        num_attention_heads=H,
        num_key_value_heads=kv_heads,
        head_dim=D,
        num_hidden_layers=layers,
        vocab_size=vocab,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "sdpa"
    return config


def problem(family: str, kv_heads: int, dtype: str, target: str = "layer", **options) -> Problem:
    architecture = Architecture(
        name=f"tiny {family}",
        family=family,
        intermediate_size=F,
        attention_bias=FAMILIES[family][2],
        qk_norm=family == "qwen3",
    )
    return Problem(
        impl="sdpa",
        target=target,
        architecture=architecture,
        seq_len=N,
        heads=H,
        kv_heads=kv_heads,
        head_dim=D,
        embed_dim=E,
        dtype=dtype,
        mode="fwdbwd",
        causal=True,
        **options,
    )


def hf_layer(family: str, kv_heads: int, dtype: torch.dtype):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    module = __import__(f"transformers.models.{family}.modeling_{family}", fromlist=["x"])
    config = hf_config(family, kv_heads)
    layer = getattr(module, FAMILIES[family][1])(config, 0).to(dtype)
    return layer, LlamaRotaryEmbedding(config)


def saved_bytes(family: str, kv_heads: int, dtype: torch.dtype, amp: bool) -> int:
    """Bytes of the distinct storages one layer's autograd graph saves, parameters left out."""
    layer, rotary = hf_layer(family, kv_heads, dtype)
    x = torch.randn(1, N, E, dtype=dtype, requires_grad=True)
    cos, sin = rotary(x, torch.arange(N)[None])
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()} | {
        t.untyped_storage().data_ptr() for t in (cos, sin)
    }
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", enabled=amp):
        layer(x, position_embeddings=(cos, sin))
    return sum(n for ptr, n in saved.items() if ptr not in params)


CASES = [  # (family, kv heads, dtype, autocast)
    ("llama", 2, "float32", False),
    ("llama", 2, "bfloat16", False),
    ("llama", 4, "bfloat16", False),
    ("llama", 2, "float32", True),
    ("mistral", 2, "bfloat16", False),
    ("qwen2", 2, "bfloat16", False),
    ("qwen2", 1, "float32", False),
    ("qwen3", 2, "bfloat16", False),
    ("qwen3", 1, "float32", False),
]


@pytest.mark.parametrize("family, kv_heads, dtype, amp", CASES)
def test_saved_set_is_what_autograd_saves(family, kv_heads, dtype, amp):
    s = problem(family, kv_heads, dtype, amp="bf16" if amp else None)
    attention = estimate_memory(s.attention_problem(), 0, "cuda").items
    predicted = sum(decoder.block_saved_bytes(s, attention).values())
    measured = saved_bytes(family, kv_heads, getattr(torch, dtype), amp)
    if amp:  # the weight copies are saved too: the test leaves every parameter-sized storage to the model's item
        predicted -= decoder.block_saved_bytes(s, attention)["autocast weight copies"]
        layer, _ = hf_layer(family, kv_heads, torch.float32)
        measured -= sum(p.numel() * 2 for p in layer.parameters() if p.dim() == 2)
    assert predicted == measured


def layer_peak(family: str, kv_heads: int, dtype: torch.dtype, amp: bool, checkpointing: bool) -> int:
    """Peak live tensor bytes of two forward and backward calls of one layer, as bench runs a layer: module,
    gradients accumulated over the calls, inputs and rotary tables included."""
    with LiveTensorBytes() as tracker:
        layer, rotary = hf_layer(family, kv_heads, dtype)
        for _ in range(2):
            x = torch.randn(1, N, E, dtype=dtype, requires_grad=True)
            cos, sin = rotary(x, torch.arange(N)[None])
            with torch.autocast("cpu", enabled=amp):
                if checkpointing:
                    out = torch.utils.checkpoint.checkpoint(
                        layer, x, position_embeddings=(cos, sin), use_reentrant=False
                    )
                else:
                    out = layer(x, position_embeddings=(cos, sin))
            out = out[0] if isinstance(out, tuple) else out
            out.backward(torch.ones_like(out))
            x = cos = sin = out = None
    return tracker.peak


@pytest.mark.parametrize(
    "family, kv_heads, dtype, amp, checkpointing",
    [(*case, False) for case in CASES] + [("llama", 2, "bfloat16", False, True)],
)
def test_layer_peak_matches_live_tensor_bytes(family, kv_heads, dtype, amp, checkpointing):
    s = problem(family, kv_heads, dtype, amp="bf16" if amp else None, checkpointing=checkpointing)
    predicted = layer_memory(s, 0, "cuda")  # "cuda": tensors only, no CPU extras
    measured = layer_peak(family, kv_heads, getattr(torch, dtype), amp, checkpointing)
    assert abs(predicted.total - measured) <= 0.10 * measured, (predicted.phase, predicted.total, measured)


def model_peak(family: str, dtype: torch.dtype, vocab: int, layers: int) -> tuple[int, int]:
    """(peak live tensor bytes, parameters) of two training steps of a transformers causal LM: the loss as
    LongNetLM takes it (cross-entropy on fp32 logits), AdamW on the weights as they are (torch-adamw)."""
    with LiveTensorBytes() as tracker:
        config = hf_config(family, 2, layers, vocab)
        model = transformers.AutoModelForCausalLM.from_config(config).to(dtype)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        for _ in range(2):
            tokens = torch.randint(0, vocab, (1, N + 1))
            hidden = model.model(input_ids=tokens[:, :-1]).last_hidden_state
            logits = model.lm_head(hidden)
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, vocab), tokens[:, 1:].reshape(-1))
            hidden = logits = None
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss = None
    return tracker.peak, sum(p.numel() for p in model.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("family, dtype", [("llama", "float32"), ("qwen2", "bfloat16")])
def test_model_step_matches_live_tensor_bytes(family, dtype):
    s = problem(family, 2, dtype, target="model", layers=2, vocab_size=2048)
    measured, params = model_peak(family, getattr(torch, dtype), 2048, 2)
    assert model_parameters(s) == params
    predicted = layer_memory(s, 0, "cuda")
    assert abs(predicted.total - measured) <= 0.10 * measured, (predicted.phase, predicted.total, measured)


class TiledMLP(torch.autograd.Function):
    """DeepSpeed's TiledMLP (runtime/sequence_parallel/ulysses_sp.py, ALST), as its docstring patches LlamaMLP: the
    MLP in sequence shards under no_grad, only its input saved; the backward recomputes and backpropagates shard by
    shard into the input's gradient, made whole."""

    @staticmethod
    def forward(ctx, fn, module, x, shards):
        ctx.fn, ctx.module, ctx.shards = fn, module, shards
        ctx.save_for_backward(x)
        with torch.no_grad():
            return torch.cat([fn(module, part) for part in torch.chunk(x, shards, dim=-2)], dim=-2)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        x = x.detach().view(-1, x.shape[-1])
        grad = grad.reshape(-1, x.shape[-1])
        x_grad = torch.zeros_like(x)
        step = -(-x.shape[0] // ctx.shards)
        for offset in range(0, x.shape[0], step):
            part = x[offset : offset + step].requires_grad_()
            with torch.enable_grad():
                out = ctx.fn(ctx.module, part)
            torch.autograd.backward(out, grad[offset : offset + step])
            x_grad[offset : offset + step] = part.grad
        return None, None, x_grad.view(ctx.saved_tensors[0].shape), None


def tiled_forward(self, x):
    shards = -(-x.shape[1] // x.shape[-1])  # DeepSpeed's example: ceil(seqlen / hidden)
    mlp = lambda module, part: module.down_proj(module.act_fn(module.gate_proj(part)) * module.up_proj(part))
    return TiledMLP.apply(mlp, self, x, shards)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_tiled_mlp_keeps_its_input_only_and_its_peak_is_predicted(dtype, monkeypatch):
    from transformers.models.llama import modeling_llama

    monkeypatch.setattr(modeling_llama.LlamaMLP, "forward", tiled_forward)
    s = problem("llama", 2, dtype)
    s = s.model_copy(update={"architecture": s.architecture.model_copy(update={"tiled_mlp": True})})
    assert decoder.mlp_shards(s) == 2  # N = 512 over E = 256
    attention = estimate_memory(s.attention_problem(), 0, "cuda").items
    assert sum(decoder.block_saved_bytes(s, attention).values()) == saved_bytes(
        "llama", 2, getattr(torch, dtype), False
    )
    untiled = problem("llama", 2, dtype)
    assert sum(decoder.block_saved_bytes(s, attention).values()) < sum(
        decoder.block_saved_bytes(untiled, attention).values()
    )
    predicted = layer_memory(s, 0, "cuda")
    measured = layer_peak("llama", 2, getattr(torch, dtype), False, False)
    assert abs(predicted.total - measured) <= 0.10 * measured, (predicted.phase, predicted.total, measured)


class _FusedRMSNorm(torch.autograd.Function):
    """What a fused RMSNorm kernel saves (Liger's LigerRMSNormFunction: X, W and the fp32 rstd per row)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (x.float() * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        normed = x.float() * rstd
        g = grad.float() * weight.float()
        dx = rstd * (g - normed * (g * normed).mean(-1, keepdim=True))
        return dx.to(x.dtype), (grad.float() * normed).sum(tuple(range(grad.dim() - 1))).to(weight.dtype), None


@pytest.mark.parametrize("family, kv_heads", [("llama", 2), ("qwen3", 2)])
def test_fused_norms_keep_their_input_and_rstd(family, kv_heads, monkeypatch):
    """--fused-norm: every RMSNorm (qwen3's q_norm and k_norm too) as one kernel saving its input and rstd."""
    module = __import__(f"transformers.models.{family}.modeling_{family}", fromlist=["x"])
    norm = getattr(module, f"{FAMILIES[family][0][: -len('Config')]}RMSNorm")
    monkeypatch.setattr(norm, "forward", lambda self, x: _FusedRMSNorm.apply(x, self.weight, self.variance_epsilon))
    s = problem(family, kv_heads, "bfloat16")
    s = s.model_copy(update={"architecture": s.arch.model_copy(update={"fused_norm": True})})
    attention = estimate_memory(s.attention_problem(), 0, "cuda").items
    predicted = sum(decoder.block_saved_bytes(s, attention).values())
    assert predicted == saved_bytes(family, kv_heads, torch.bfloat16, False)
