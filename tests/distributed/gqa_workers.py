"""GQA on every distributed form (run on every rank by run_distributed): q at H = 8 heads, k and v at H_kv."""

import torch

N, H, D, B = 96, 8, 8, 2
SEGS, RATES = [8, 48, 96], [1, 2, 3]  # at p = 2 and 4: a segment inside a shard, one spanning 2 ranks, one all
KV_HEADS = (8, 2, 1)
BLOCK = 8


def inputs(kv_heads: int, causal: bool):
    g = torch.Generator().manual_seed(100 * kv_heads + causal)
    q, up = (torch.randn(B, N, H, D, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(B, N, kv_heads, D, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, v, up


def module_for(impl: str):
    from dattn_cli.kernels import REGISTRY

    if REGISTRY[impl].block_sparse:
        return REGISTRY[impl].cls(pattern="longnet", segment_lengths=SEGS, dilation_rates=RATES, block_size=BLOCK,
                                  process_group=None)
    return REGISTRY[impl].cls(SEGS, RATES)


def gqa_cases(rank: int, world: int, impl: str):
    """Per (kv heads, causal): this rank's out, lse, q/k/v gradient shards and comm counts."""
    results = {}
    shard = slice(rank * N // world, (rank + 1) * N // world)
    for kv_heads in KV_HEADS:
        for causal in (False, True):
            q, k, v, up = inputs(kv_heads, causal)
            xs = [x[:, shard].clone().requires_grad_() for x in (q, k, v)]
            module = module_for(impl)
            out, lse = module.forward_with_lse(*xs, causal)
            out.backward(up[:, shard])
            results[kv_heads, causal] = {"out": out.detach(), "lse": lse, "grads": [x.grad for x in xs],
                                         "comm": module.comm_stats()}
    return results
