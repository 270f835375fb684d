"""Selective recompute (plan/recompute.py) against torch's selective checkpointing of transformers' decoder layers
under torchtitan's op policy: which matmul outputs are kept, their bytes, and a model step's peak."""

import pytest
import torch

from dattn_cli.plan.layers import StepOptions, layer_memory, recompute_factors
from dattn_cli.plan.recompute import kept_matmuls, kept_outputs
from dattn_cli.runtime.measure import LiveTensorBytes
from tests.cli.test_verify_env import run_cli
from tests.plan.test_decoder import N, hf_config, hf_layer, problem

transformers = pytest.importorskip("transformers")
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts  # noqa: E402

ATTENTION_OPS = {  # torchtitan's _save_list attention kernels, and the CPU one these tests run
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
}


def torchtitan_policy(kept: list, attention: list | None = None):
    """torchtitan's op-level policy as a checkpoint context_fn: per checkpointed call, keep the attention kernels'
    outputs and every other aten.mm's (the 1st, 3rd, ... of the block); `kept` collects the kept mm outputs' bytes
    (rows x columns of its operands)."""

    attention = [] if attention is None else attention

    def context_fn():
        meta = {"forward": 0, "recompute": 0}

        def policy(ctx, func, *args, **kwargs):
            if func in ATTENTION_OPS:  # out (B, H, N, D) like q, and the fp32 lse (B, H, N)
                if not ctx.is_recompute:
                    attention.append(args[0].numel() * args[0].element_size() + args[0][..., 0].numel() * 4)
                return CheckpointPolicy.MUST_SAVE
            if func != torch.ops.aten.mm.default:
                return CheckpointPolicy.PREFER_RECOMPUTE
            key = "recompute" if ctx.is_recompute else "forward"
            meta[key] += 1
            if meta[key] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
            if not ctx.is_recompute:
                kept.append(args[0].shape[0] * args[1].shape[1] * args[0].element_size())
            return CheckpointPolicy.MUST_SAVE

        return create_selective_checkpoint_contexts(policy)

    return context_fn


@pytest.mark.parametrize("family, kept", [("llama", ["q", "v", "gate", "down"]), ("qwen2", ["o", "up"])])
def test_the_kept_matmuls_are_those_torch_keeps(family, kept):
    """Qwen2's q, k, v have biases (addmm): the policy counts only o, gate, up, down and keeps o and up."""
    s = problem(family, 2, "bfloat16")
    assert kept_matmuls(s)[0] == kept
    layer, rotary = hf_layer(family, 2, torch.bfloat16)
    x = torch.randn(1, N, s.width, dtype=torch.bfloat16, requires_grad=True)
    cos, sin = rotary(x, torch.arange(N)[None])
    recorded: list[int] = []
    attention: list[int] = []
    torch.utils.checkpoint.checkpoint(
        layer, x, position_embeddings=(cos, sin), use_reentrant=False, context_fn=torchtitan_policy(recorded, attention)
    )
    items = kept_outputs(s)
    assert sum(recorded) == next(v for k, v in items.items() if k.startswith("kept matmul"))
    assert sum(attention) == items["kept attention output and lse"]


def model_step_peak(family: str, dtype: torch.dtype, layers: int, context_fn) -> int:
    """Peak live tensor bytes of two training steps of a transformers causal LM with every layer checkpointed
    (context_fn None: full recompute), the loss on fp32 logits, AdamW on the weights as they are."""
    vocab = 512
    with LiveTensorBytes() as tracker:
        model = transformers.AutoModelForCausalLM.from_config(hf_config(family, 2, layers, vocab)).to(dtype)
        kwargs = {"use_reentrant": False, **({"context_fn": context_fn} if context_fn else {})}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x (the older name is deprecated)
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        for _ in range(2):
            tokens = torch.randint(0, vocab, (1, N + 1))
            logits = model.lm_head(model.model(input_ids=tokens[:, :-1]).last_hidden_state)
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, vocab), tokens[:, 1:].reshape(-1))
            logits = None
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss = None
    return tracker.peak


@pytest.mark.slow
@pytest.mark.parametrize("selective", [False, True])
def test_a_checkpointed_model_step_matches_live_tensor_bytes(selective):
    layers = 4
    s = problem("llama", 2, "bfloat16", target="model", layers=layers, vocab_size=512, checkpointing=not selective)
    measured = model_step_peak("llama", torch.bfloat16, layers, torchtitan_policy([]) if selective else None)
    predicted = layer_memory(s, 0, "cuda", options=StepOptions(selective=selective))
    assert abs(predicted.total - measured) <= 0.10 * measured, (predicted.phase, predicted.total, measured)


def test_selective_sits_between_none_and_full():
    base = dict(target="model", layers=8, vocab_size=512)
    none = layer_memory(problem("llama", 2, "bfloat16", **base), 0, "cuda").total
    full = layer_memory(problem("llama", 2, "bfloat16", checkpointing=True, **base), 0, "cuda").total
    selective = layer_memory(problem("llama", 2, "bfloat16", **base), 0, "cuda", options=StepOptions(selective=True))
    assert full < selective.total < none
    s = problem("llama", 2, "bfloat16", **base)
    full_time, selective_time = (
        recompute_factors(s.model_copy(update={"checkpointing": True}))[1],
        recompute_factors(s, selective=True)[1],
    )
    assert 1.0 < selective_time < full_time  # k, o and up run again: 3 of 7 projections' forward


def test_plan_recompute_option(capsys):
    args = ["plan", "--profile", "h100-sxm-80gb", "--model", "llama-3.1-8b", "--seq-len", "16k", "--mode", "fwdbwd"]
    code, stdout, err = run_cli([*args, "--dtype", "bfloat16", "--recompute", "selective", "--json", "-"], capsys)
    assert code == 0, err
    import json

    data = json.loads(stdout)
    assert data["training"]["recompute"] == "selective" and not data["problem"]["checkpointing"]
    assert any("kept matmul outputs (q, v, gate, down)" in item for item in data["memory"]["items"])
    code, stdout, err = run_cli([*args, "--recompute", "full", "--json", "-"], capsys)
    assert code == 0 and json.loads(stdout)["problem"]["checkpointing"], err
    for bad, message in [
        (["--checkpointing", "--recompute", "selective"], "--checkpointing is --recompute full"),
        (["--recompute", "partial"], "--recompute"),
    ]:
        code, _, err = run_cli([*args, *bad], capsys)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    code, _, err = run_cli(["plan", "--target", "model", "--seq-len", "4096", "--recompute", "selective"], capsys)
    assert code == 2 and "--model or --model-config" in err, err
    code, _, err = run_cli(["plan", "--seq-len", "4096", "--recompute", "selective"], capsys)
    assert code == 2 and "apply to --target model" in err, err
    for bad, message in [
        (["--recompute", "selective", "--tiled-mlp"], "--recompute selective with --tiled-mlp"),
        (["--tiled-mlp", "--amp", "bf16"], "--tiled-mlp with --amp"),
    ]:
        code, _, err = run_cli([*args, *bad], capsys)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_the_recompute_mode_must_agree_with_the_problem():
    from dattn_cli.plan.parallel import Training, model_memory
    from dattn_cli.plan.profiles import load_profile

    s = problem("llama", 2, "bfloat16", target="model", layers=2, vocab_size=512)
    for problem_, mode in [(s, "full"), (s.model_copy(update={"checkpointing": True}), "selective")]:
        with pytest.raises(ValueError, match="disagree"):
            model_memory(problem_, load_profile("h100-sxm-80gb"), Training(recompute=mode), "cuda")
