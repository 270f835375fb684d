"""Rank functions (module level, so rank processes import them) for the hybrid h x ring classes: every rank makes
the groups with hybrid_groups, takes its shard of the whole sequence (contiguous or zigzag over p ranks), and
returns its out, lse, gradient shards and byte counts."""

import torch

from dattn_cli.kernels.distributed.sharding import rank_shard

B, D, N = 2, 8, 64
# (heads, kv heads, segments, dilations, semantics, causal, masked): segments inside a ring shard, spanning
# several and all of them; r = 2, 3, 4; GQA and MQA (kv heads repeated when h exceeds them); key masks
CASES = [
    (4, 4, [8, 32, 64], [1, 2, 4], "longnet", False, False),
    (4, 4, [8, 32, 64], [1, 2, 4], "longnet", True, False),
    (4, 2, [16, 64], [1, 3], "head_groups", True, True),
    (4, 2, [16, 64], [1, 3], "head_groups", False, False),
    (4, 1, [8, 32, 64], [1, 2, 4], "longnet", True, True),
]
LAYOUTS = ("contiguous", "zigzag")


def inputs(case: int):
    H, KV, *_, masked = CASES[case]
    g = torch.Generator().manual_seed(31 + case)
    q, up = (torch.randn(B, N, H, D, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(B, N, KV, D, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.rand(B, N, generator=g) < 0.3 if masked else None
    return q, k, v, up, mask


def hybrid_cases(rank: int, world: int, h: int):
    """Per (layout, case): this rank's out, lse, gradient shards and byte counts; and the multihead wrapper's
    largest difference from the single-device module (rotary, zigzag)."""
    from dattn_cli.kernels import HybridDilatedAttention, hybrid_groups

    head_group, ring_group = hybrid_groups(None, h)
    results = {}
    for layout in LAYOUTS:
        for c, (_H, _KV, segs, rates, sem, causal, _masked) in enumerate(CASES):
            q, k, v, up, mask = inputs(c)
            shard = dict(key_padding_mask=mask, layout=layout)
            xs = [rank_shard(x, rank, world, N // world, **shard)[0].float().requires_grad_() for x in (q, k, v)]
            upstream, shard_mask = rank_shard(up, rank, world, N // world, **shard)
            module = HybridDilatedAttention(
                segs, rates, semantics=sem, layout=layout, head_group=head_group, ring_group=ring_group
            )
            out, lse = module.forward_with_lse(*xs, causal, key_padding_mask=shard_mask)
            grads = torch.autograd.grad(out, xs, upstream.float())
            results[layout, c] = {
                "out": out.detach(),
                "lse": lse.detach(),
                "grads": [g.detach() for g in grads],
                "comm": module.comm_stats(),
            }
    results["multihead"] = _multihead_error(rank, world, head_group, ring_group)
    return results


def _multihead_error(rank, world, head_group, ring_group) -> float:
    """HybridMultiheadDilatedAttention with rotary embeddings over zigzag shards against the single-device module
    with the same weights on the whole sequence: the largest absolute difference on this rank's rows."""
    from dattn_cli.kernels import HybridMultiheadDilatedAttention, ImprovedMultiheadDilatedAttention
    from dattn_cli.kernels.distributed.layout import rank_positions

    segs, rates = [8, 32, 64], [1, 2, 4]
    torch.manual_seed(0)
    single = ImprovedMultiheadDilatedAttention(32, 4, segment_lengths=segs, dilation_rates=rates, rotary=True)
    module = HybridMultiheadDilatedAttention(
        32, 4, segment_lengths=segs, dilation_rates=rates, rotary=True, layout="zigzag",
        head_group=head_group, ring_group=ring_group,
    )  # fmt: skip
    module.load_state_dict(single.state_dict())
    x = torch.randn(B, N, 32, generator=torch.Generator().manual_seed(1))
    shard = rank_shard(x, rank, world, N // world, layout="zigzag")[0]
    out = module(shard, shard, shard, is_causal=True)[0]
    ref = single(x, x, x, is_causal=True)[0]
    return (out - ref[:, rank_positions(rank, world, N // world, "zigzag")]).abs().max().item()


def refusals(rank: int, world: int) -> list[str]:
    """The one-line refusals: a module without its groups, heads that do not split over h."""
    from dattn_cli.kernels import HybridDilatedAttention, hybrid_groups

    messages = []
    try:
        HybridDilatedAttention([8], [1])
    except ValueError as exc:
        messages.append(str(exc))
    head_group, ring_group = hybrid_groups(None, 2)
    q = torch.randn(1, 8, 3, 4)
    try:
        HybridDilatedAttention([8], [1], head_group=head_group, ring_group=ring_group)(q, q, q)
    except ValueError as exc:
        messages.append(str(exc))
    return messages
