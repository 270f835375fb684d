"""The tiny Llama of the transformers integration tests, and what each rank of a context-parallel step returns
(module level, so rank processes can import it)."""

import torch

CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=128,
    use_cache=False,
    dattn_segment_lengths=[16, 64],
    dattn_dilation_rates=[1, 2],
)
BATCH, N = 2, 64


def build_model(attn_implementation: str):
    """The Llama of CONFIG with seeded random weights (the same for every implementation)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**CONFIG, attn_implementation=attn_implementation))


def token_ids() -> torch.Tensor:
    return torch.randint(0, CONFIG["vocab_size"], (BATCH, N), generator=torch.Generator().manual_seed(1))


def single_process_step(attn_implementation: str) -> dict:
    """Logits, loss and parameter gradients of one step on the whole sequence, transformers' own loss."""
    model = build_model(attn_implementation)
    ids = token_ids()
    out = model(ids, labels=ids)
    out.loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    return {"logits": out.logits.detach(), "loss": out.loss.detach(), "grads": grads}


def context_parallel_step(rank: int, world: int, attn_implementation: str, group=None) -> dict:
    """This rank's logits shard, the global loss and the gradients summed over the ranks of `group`."""
    from dattn_cli.integrations import transformers as hf

    model = build_model(attn_implementation)
    if group is not None:  # its hybrid groups are made at the first call (an all-gather of every rank's group)
        hf.set_process_group(model, group)
    elif attn_implementation == "dattn_hybrid" and world == 4:  # 2x2; on 2 ranks its groups come at the first call
        hf.setup_hybrid(model)
    batch = hf.shard_causal_lm_batch(token_ids(), group=group, segment_lengths=CONFIG["dattn_segment_lengths"])
    out = model(**batch)
    out.loss.backward()
    hf.all_reduce_gradients(model, group)
    grads = {name: p.grad for name, p in model.named_parameters()}
    made = model.model.layers[0].self_attn.__dict__[hf._CACHE].values()
    modules = [m.describe().split(" (")[0] if hasattr(m, "describe") else type(m).__name__ for m in made]
    loss = hf.all_reduce_loss(out.loss, group)
    return {"logits": out.logits.detach(), "loss": loss, "grads": grads, "modules": modules}


def context_parallel_steps(rank: int, world: int, attn_implementations: list[str]) -> dict:
    """Each name's step over every rank; on 4 ranks also dattn_hybrid 2x1 inside two sequence-parallel groups of 2
    (dp x sp: ranks 0-1 and 2-3, each running the whole batch), under the key "dattn_hybrid sp".
    """
    import torch.distributed as dist

    steps = {name: context_parallel_step(rank, world, name) for name in attn_implementations}
    if world == 4:
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        steps["dattn_hybrid sp"] = context_parallel_step(rank, world, "dattn_hybrid", groups[rank // 2])
    return steps
