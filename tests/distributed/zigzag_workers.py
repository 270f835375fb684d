"""Rank functions (module level, so rank processes import them) for zigzag shards: each rank takes its shard
from shard_sequence(..., layout="zigzag") (padded and masked when N is not aligned), runs a ring or
all-gather module with layout="zigzag", and returns its padded shard of outputs, gradients and byte counts."""

import torch

from dattn_cli.kernels import shard_sequence

B, D = 2, 8
# (N, heads, kv heads, segment lengths, dilation rates): ŵ = N spans every chunk (a rank's two chunks share a
# segment); GQA with segments spanning chunk pairs and their mirror groups; a ragged N (padded, masked);
# dense causal (one segment of N)
CASES = [
    (64, 4, 4, [8, 64], [1, 2]),
    (64, 4, 2, [16, 32], [1, 2]),
    (50, 4, 4, [10, 100], [1, 3]),
    (48, 2, 1, [48], [1]),
]
VARIANTS = [
    (sem, causal, masked) for sem in ("longnet", "head_groups") for causal in (False, True) for masked in (False, True)
]


def inputs(case: int, variant: int):
    N, H, KV, _, _ = CASES[case]
    g = torch.Generator().manual_seed(100 * case + variant)
    q, up = (torch.randn(B, N, H, D, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(B, N, KV, D, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.rand(B, N, generator=g) < 0.3 if VARIANTS[variant][2] else None
    return q, k, v, up, mask


def zigzag_cases(rank: int, world: int, impl: str):
    """Per (case, variant): this rank's padded out, lse, gradient shards, its mask and byte counts."""
    from dattn_cli.kernels import REGISTRY

    results = {}
    for c, (_N, _H, _KV, segs, rates) in enumerate(CASES):
        for i, (sem, causal, _masked) in enumerate(VARIANTS):
            q, k, v, up, mask = inputs(c, i)
            sharding = dict(segment_lengths=segs, layout="zigzag", key_padding_mask=mask)
            shards = [shard_sequence(x, **sharding) for x in (q, k, v, up)]
            xs = [s.float().requires_grad_() for s, _ in shards[:3]]
            module = REGISTRY[impl].cls(segs, rates, semantics=sem, layout="zigzag")
            out, lse = module.forward_with_lse(*xs, causal, key_padding_mask=shards[0][1])
            grads = torch.autograd.grad(out, xs, shards[3][0].float())
            results[c, i] = {
                "out": out.detach(),
                "lse": lse.detach(),
                "grads": [g.detach() for g in grads],
                "masked": shards[0][1] is not None,
                "comm": module.comm_stats(),
            }
    return results


# block-sparse ring, block size 8: (module options, N); N = 50 is padded (seq_len= keeps the real table)
BS_CASES = [
    (dict(pattern="local", window=1), 64),
    (dict(pattern="dilated", segment_lengths=[16, 64], dilation_rates=[1, 3]), 64),
    (dict(pattern="longnet", segment_lengths=[16, 64], dilation_rates=[1, 2]), 50),
]
BS_VARIANTS = [(causal, masked) for causal in (False, True) for masked in (False, True)]


def bs_inputs(case: int, variant: int):
    _, n = BS_CASES[case]
    g = torch.Generator().manual_seed(10 * case + variant)
    q, up = (torch.randn(B, n, 4, D, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(B, n, 2, D, generator=g, dtype=torch.float64) for _ in range(2))  # GQA
    mask = torch.rand(B, n, generator=g) < 0.25 if BS_VARIANTS[variant][1] else None
    return q, k, v, up, mask


def block_sparse_zigzag_cases(rank: int, world: int):
    from dattn_cli.kernels import BlockSparseRingDilatedAttention

    results = {}
    for c, (options, n) in enumerate(BS_CASES):
        for i, (causal, _masked) in enumerate(BS_VARIANTS):
            q, k, v, up, mask = bs_inputs(c, i)
            sharding = dict(block_size=8, layout="zigzag", key_padding_mask=mask)
            shards = [shard_sequence(x, **sharding) for x in (q, k, v, up)]
            xs = [s.float().requires_grad_() for s, _ in shards[:3]]
            module = BlockSparseRingDilatedAttention(block_size=8, layout="zigzag", **options)
            out, lse = module.forward_with_lse(*xs, causal, key_padding_mask=shards[0][1], seq_len=n)
            grads = torch.autograd.grad(out, xs, shards[3][0].float())
            padded = xs[0].shape[1] * world
            masked = shards[0][1] is not None
            results[c, i] = {
                "out": out.detach(),
                "lse": lse.detach(),
                "grads": [g.detach() for g in grads],
                "comm": module.comm_stats(),
                "expected": module.comm_volume(n, 4, D, B, 4, causal, masked, padded, num_kv_heads=2),
            }
    return results


def rotary_multihead_error(rank: int, world: int, impl: str) -> float:
    """A multihead wrapper with rotary embeddings over zigzag shards against the single-device module with the
    same weights on the whole sequence: the largest absolute difference on this rank's real rows."""
    from dattn_cli.kernels import REGISTRY, ImprovedMultiheadDilatedAttention
    from dattn_cli.kernels.distributed.layout import rank_positions

    n, segs, rates = 50, [10, 100], [1, 3]
    torch.manual_seed(0)
    single = ImprovedMultiheadDilatedAttention(32, 4, segment_lengths=segs, dilation_rates=rates, rotary=True)
    module = REGISTRY[impl].cls(32, 4, segment_lengths=segs, dilation_rates=rates, rotary=True, layout="zigzag")
    module.load_state_dict(single.state_dict())
    x = torch.randn(B, n, 32, generator=torch.Generator().manual_seed(1))
    shard, mask = shard_sequence(x, segment_lengths=segs, layout="zigzag")
    out = module(shard, shard, shard, is_causal=True, key_padding_mask=mask)[0]
    ref = single(x, x, x, is_causal=True)[0]
    positions = rank_positions(rank, world, shard.shape[1], "zigzag")
    real = positions < n
    return (out[:, real] - ref[:, positions[real]]).abs().max().item()
