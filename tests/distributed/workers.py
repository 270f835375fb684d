"""Functions run on every rank by run_distributed (module level, so rank processes can import them)."""

import torch

from dattn_cli.kernels import HeadParallelDilatedAttention

SHAPE = dict(B=2, N=64, H=8, D=8)
CASES = [
    (sem, causal, segs, rates)
    for sem in ("longnet", "head_groups")
    for causal in (False, True)
    for segs, rates in (([8, 16], [1, 2]), ([16, 64], [1, 4]), ([12, 64], [2, 3]))
]


def full_inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    B, N, H, D = SHAPE.values()
    return [torch.randn(B, N, H, D, generator=g, dtype=torch.float64) for _ in range(4)]


def head_parallel_cases(rank: int, world: int):
    """Per case: this rank's output and gradient shards, and its comm byte counts."""
    results = []
    for i, (sem, causal, segs, rates) in enumerate(CASES):
        q, k, v, upstream = full_inputs(i)
        length = SHAPE["N"] // world
        shard = slice(rank * length, (rank + 1) * length)
        xs = [x[:, shard].float().clone().requires_grad_() for x in (q, k, v)]
        module = HeadParallelDilatedAttention(segs, rates, semantics=sem)
        out = module(*xs, is_causal=causal)
        out.backward(upstream[:, shard].float())
        results.append({"out": out.detach(), "grads": [x.grad for x in xs], "comm": module.comm_stats()})
    return results


def fail_on_rank_one(rank: int, world: int):
    if rank == 1:
        raise RuntimeError("deliberate failure on this rank")
    torch.distributed.barrier()  # the healthy ranks wait in a collective that can never complete
    return rank


def mismatched_shapes(rank: int, world: int):
    length = 16 if rank == 0 else 24
    q = torch.randn(1, length, 4, 8)
    HeadParallelDilatedAttention([8], [1])(q, q, q)
    return rank


# Sequence-parallel (ring, all-gather) cases: (N, H, segments, dilations); B = 2, D = 8. Chosen so that
# across p = 2, 3, 4 segments are shorter than, equal to and longer than the shard, groups are ragged,
# r does not divide N/p, w exceeds N, and (N=64, [8, 16]) every segment fits in a shard.
SP_CASES = [
    (48, 4, [12, 48], [1, 2]),
    (96, 5, [8, 48, 96], [1, 2, 5]),
    (96, 3, [16, 64, 96], [1, 3, 2]),
    (36, 3, [12, 72], [1, 5]),
    (64, 4, [8, 16], [1, 2]),
]
SP_VARIANTS = [
    (sem, causal, mask) for sem in ("longnet", "head_groups") for causal in (False, True) for mask in (False, True)
]


def sp_inputs(case: int, variant: int):
    N, H, _, _ = SP_CASES[case]
    g = torch.Generator().manual_seed(1000 * case + variant)
    q, k, v, up = (torch.randn(2, N, H, 8, generator=g, dtype=torch.float64) for _ in range(4))
    mask = torch.rand(2, N, generator=g) < 0.3 if SP_VARIANTS[variant][2] else None
    return q, k, v, up, mask


def sp_shardable(case: int, world: int) -> bool:
    N, _, segs, _ = SP_CASES[case]
    shard = N // world
    return N % world == 0 and all(shard % min(w, N) == 0 or min(w, N) % shard == 0 for w in segs)


def sequence_parallel_cases(rank: int, world: int, impl: str):
    """Per (case, variant) this rank's out, lse, gradient shards and comm counts (None: not shardable)."""
    from dattn_cli.kernels import REGISTRY

    results = {}
    for c, (N, _H, segs, rates) in enumerate(SP_CASES):
        if not sp_shardable(c, world):
            continue
        shard = slice(rank * N // world, (rank + 1) * N // world)
        for i, (sem, causal, _masked) in enumerate(SP_VARIANTS):
            q, k, v, up, mask = sp_inputs(c, i)
            xs = [x[:, shard].float().clone().requires_grad_() for x in (q, k, v)]
            module = REGISTRY[impl].cls(segs, rates, semantics=sem)
            out, lse = module.forward_with_lse(*xs, causal, key_padding_mask=None if mask is None else mask[:, shard])
            out.backward(up[:, shard].float())
            results[c, i] = {
                "out": out.detach(),
                "lse": lse,
                "grads": [x.grad for x in xs],
                "comm": module.comm_stats(),
            }
    return results


def ring_with_rank_specific_segments(rank: int, world: int):
    from dattn_cli.kernels import RingDilatedAttention

    q = torch.randn(1, 16, 2, 4)
    return RingDilatedAttention([8, 32 if rank == 0 else 64], [1, 2])(q, q, q)


def ring_multihead_under_group(rank: int, world: int):
    """RingMultiheadDilatedAttention on an explicit process group (the world, passed by handle)."""
    from dattn_cli.kernels import RingMultiheadDilatedAttention

    torch.manual_seed(0)
    module = RingMultiheadDilatedAttention(
        16, 2, segment_lengths=[8, 32], dilation_rates=[1, 2], process_group=torch.distributed.group.WORLD
    )
    x = torch.randn(1, 32, 16, generator=torch.Generator().manual_seed(1))[:, rank * 16 : (rank + 1) * 16]
    out, _ = module(x, x, x)
    out.sum().backward()
    return module.comm_stats()


def ring_event_order(rank: int, world: int):
    """The order in which the ring posts transfers and computes blocks, on a 3-rank segment."""
    import torch.distributed as dist

    from dattn_cli.kernels import RingDilatedAttention
    from dattn_cli.kernels.distributed import ring

    events = []
    post, attend = dist.batch_isend_irecv, ring.attend_member

    def logged_post(ops):
        events.append("post")
        return post(ops)

    def logged_attend(attention, plan, member, *rest):
        events.append(f"compute {member}")
        return attend(attention, plan, member, *rest)

    dist.batch_isend_irecv, ring.attend_member = logged_post, logged_attend
    try:
        q = torch.randn(1, 16, 2, 4)
        RingDilatedAttention([48], [1])(q, q, q)
    finally:
        dist.batch_isend_irecv, ring.attend_member = post, attend
    return events


def small_ring(rank: int, world: int):
    from dattn_cli.kernels import RingDilatedAttention

    q = torch.randn(1, 16, 2, 4, generator=torch.Generator().manual_seed(rank))
    return RingDilatedAttention([32], [2])(q, q, q).sum().item()


# Block-sparse ring cases: (pattern options, N); B = 2, H = 3, D = 8, block size 8.
BS_CASES = [
    (dict(pattern="local", window=1), 64),
    (dict(pattern="global_local", window=1, global_blocks=1), 64),
    (dict(pattern="dilated", segment_lengths=[16, 64], dilation_rates=[1, 3]), 64),
    (dict(pattern="hierarchical", window=1, levels=2), 96),
    (dict(pattern="longnet", segment_lengths=[16, 64], dilation_rates=[1, 2]), 64),
]
BS_VARIANTS = [(causal, mask) for causal in (False, True) for mask in (False, True)]


def bs_inputs(case: int, variant: int):
    _, n = BS_CASES[case]
    g = torch.Generator().manual_seed(100 * case + variant)
    xs = [torch.randn(2, n, 3, 8, generator=g, dtype=torch.float64) for _ in range(4)]
    mask = torch.rand(2, n, generator=g) < 0.25 if BS_VARIANTS[variant][1] else None
    return (*xs, mask)


def block_sparse_cases(rank: int, world: int):
    from dattn_cli.kernels import BlockSparseRingDilatedAttention

    results = {}
    for c, (options, n) in enumerate(BS_CASES):
        if (n // world) % 8:
            continue
        for i, (causal, masked) in enumerate(BS_VARIANTS):
            q, k, v, up, mask = bs_inputs(c, i)
            shard = slice(rank * (n // world), (rank + 1) * (n // world))
            xs = [x[:, shard].float().clone().requires_grad_() for x in (q, k, v)]
            module = BlockSparseRingDilatedAttention(block_size=8, **options)
            out, lse = module.forward_with_lse(*xs, causal, key_padding_mask=None if mask is None else mask[:, shard])
            grads = torch.autograd.grad(out, xs, up[:, shard].float())
            results[c, i] = {
                "out": out.detach(),
                "lse": lse,
                "grads": grads,
                "comm": module.comm_stats(),
                "expected": module.comm_volume(n, 3, 8, 2, 4, causal, masked),
                "received": {src: list(b) for src, b in module.received_blocks().items()},
            }
    return results


def block_sparse_bad_shard(rank: int, world: int):
    from dattn_cli.kernels import BlockSparseRingDilatedAttention

    x = torch.randn(1, 12, 2, 8)
    BlockSparseRingDilatedAttention(pattern="local", block_size=8)(x, x, x)


# Data x sequence parallel (issue 18, item 2): `world` ranks as world/sp groups of sp consecutive ranks, made
# up front on every rank in the same order; each group shards a DIFFERENT sequence (seeded by its index).
# N = 48, B = 2, H = 4, D = 8 (E = 32), float64. With sp = 4 (L = 12) segment 24 spans 2 of the group's 4
# ranks (the all-gather's point-to-point path) and 48 all 4 (its collective path); r = 5 leaves ragged rows.
DP_SP = dict(B=2, N=48, H=4, D=8)
DP_SP_PATTERN = dict(segment_lengths=[12, 24, 48], dilation_rates=[1, 2, 5])
DP_SP_IMPLS = {
    "RingDilatedAttention": DP_SP_PATTERN,
    "DistributedImprovedDilatedAttention": DP_SP_PATTERN,
    "HeadParallelDilatedAttention": DP_SP_PATTERN,
    "BlockSparseRingDilatedAttention": dict(
        pattern="dilated", segment_lengths=[12, 48], dilation_rates=[1, 2], block_size=4
    ),
    "RingMultiheadDilatedAttention": DP_SP_PATTERN,
    "DistributedImprovedMultiheadDilatedAttention": DP_SP_PATTERN,
    "HeadParallelMultiheadDilatedAttention": DP_SP_PATTERN,
}


def dp_sp_inputs(data_index: int, causal: bool):
    """The whole sequence of data-parallel replica `data_index`: q, k, v, upstream (B, N, H, D) float64."""
    B, N, H, D = DP_SP.values()
    g = torch.Generator().manual_seed(7000 + 10 * data_index + int(causal))
    return [torch.randn(B, N, H, D, generator=g, dtype=torch.float64) for _ in range(4)]


def seeded_multihead_module(impl: str, seed: int, **options):
    """`impl` (a multihead class) with the same weights wherever it is built: seeded init, then every
    parameter moved off its init (biases, LayerNorm) so that each gradient is non-trivial."""
    from dattn_cli.kernels import REGISTRY

    torch.manual_seed(seed)
    heads = options.pop("num_heads", DP_SP["H"])
    module = REGISTRY[impl].cls(heads * DP_SP["D"], heads, dtype=torch.float64, **options)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in module.parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=g, dtype=torch.float64))
    return module


def sharded_outputs(module, kind: str, inputs, shard: slice, causal: bool) -> dict:
    """One rank's outputs: a core's out, lse and dq/dk/dv shards; a multihead module's out and dx shards and
    its parameter gradients (x = the sequence's q, flattened to (B, L, E))."""
    q, k, v, up = inputs
    if kind == "multihead":
        x = q.flatten(2)[:, shard].clone().requires_grad_()
        out, _ = module(x, x, x, is_causal=causal)
        params = list(module.parameters())
        grads = torch.autograd.grad(out, [x, *params], up.flatten(2)[:, shard])
        return {
            "out": out.detach(),
            "dx": grads[0],
            "dparams": [g.detach() for g in grads[1:]],
            "comm": module.comm_stats(),
        }
    xs = [t[:, shard].clone().requires_grad_() for t in (q, k, v)]
    out, lse = module.forward_with_lse(*xs, causal)
    grads = torch.autograd.grad(out, xs, up[:, shard])
    return {"out": out.detach(), "lse": lse.detach(), "grads": list(grads), "comm": module.comm_stats()}


def dp_sp_cases(rank: int, world: int, sp: int):
    """Every DP_SP_IMPLS entry, causal and not, on this rank's shard of its group's sequence."""
    import torch.distributed as dist

    from dattn_cli.kernels import REGISTRY

    groups = [dist.new_group(list(range(first, first + sp))) for first in range(0, world, sp)]
    group, data_index, member = groups[rank // sp], rank // sp, rank % sp
    assert dist.get_rank(group) == member and dist.get_world_size(group) == sp
    length = DP_SP["N"] // sp
    shard = slice(member * length, (member + 1) * length)
    results = {}
    for impl, options in DP_SP_IMPLS.items():
        kind = REGISTRY[impl].kind
        for causal in (False, True):
            if kind == "multihead":
                module = seeded_multihead_module(impl, 11, process_group=group, **options)
            else:
                module = REGISTRY[impl].cls(**options, process_group=group)
            results[impl, causal] = sharded_outputs(module, kind, dp_sp_inputs(data_index, causal), shard, causal)
    return results


# The auto factories (issue 18, item 3): what `auto` builds with and without a sequence-parallel group.
def auto_choices(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from dattn_cli.kernels import create_dilated_attention, create_multihead_dilated_attention

    pattern = dict(segment_lengths=[8, 16], dilation_rates=[1, 2])
    built = {
        "core": create_dilated_attention(**pattern),
        "core, process_group=None": create_dilated_attention(**pattern, process_group=None),
        "core, process_group": create_dilated_attention(**pattern, process_group=dist.group.WORLD),
        "multihead": create_multihead_dilated_attention(embed_dim=16, num_heads=2, **pattern),
        "multihead, process_group": create_multihead_dilated_attention(
            embed_dim=16, num_heads=2, **pattern, process_group=dist.group.WORLD
        ),
    }
    core = lambda m: getattr(m, "attention", m) if hasattr(m, "embed_dim") else m  # noqa: E731
    return {name: (type(m).__name__, core(m).selection_reason) for name, m in built.items()}


# check_consistent (issue 18, item 7): its collective runs once per new (shape, dtype, config) per module.
def consistency_all_gathers(rank: int, world: int) -> list[int]:
    """dist.all_gather calls (check_consistent's only collective here) after each stage of calls."""
    import os

    import torch.distributed as dist

    from dattn_cli.kernels import BlockSparseRingDilatedAttention, HeadParallelDilatedAttention, RingDilatedAttention

    calls = []
    real = dist.all_gather

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    dist.all_gather = counted
    try:
        ring, heads = RingDilatedAttention([8, 32], [1, 2]), HeadParallelDilatedAttention([8, 32], [1, 2])
        sparse = BlockSparseRingDilatedAttention([8, 32], [1, 2], block_size=8)  # p2p only: no all_gather of its own
        small, large = torch.randn(1, 16, 2, 4), torch.randn(1, 32, 2, 4)
        counts = []
        for stage in (["small"] * 3, ["large"], ["small", "large"], "debug"):
            if stage == "debug":
                os.environ["DATTN_DEBUG_CONSISTENCY"] = "1"
                stage = ["small", "small"]
            for name in stage:
                x = small if name == "small" else large
                ring(x, x, x)
                heads(x, x, x)
                sparse(x, x, x)
            counts.append(len(calls))
        return counts
    finally:
        dist.all_gather = real
        os.environ.pop("DATTN_DEBUG_CONSISTENCY", None)


def mismatch_after_a_checked_shape(rank: int, world: int, debug: bool):
    """Both ranks agree on a first shape; then they differ: both on new shapes (caught without the debug
    option), or rank 0 repeating the checked shape while rank 1 moves on (caught under it)."""
    import os

    from dattn_cli.kernels import RingDilatedAttention

    if debug:
        os.environ["DATTN_DEBUG_CONSISTENCY"] = "1"
    ring = RingDilatedAttention([8, 32], [1, 2])
    x = torch.randn(1, 16, 2, 4)
    ring(x, x, x)
    ring(x, x, x)
    batch = 1 if debug and rank == 0 else 2 + rank
    y = torch.randn(batch, 16, 2, 4)
    ring(y, y, y)
    return rank


# Multihead wrappers of the all-gather and head-parallel forms (issue 18, item 6): (impl, world, causal).
WRAPPER = dict(N=48, H=6, segment_lengths=[8, 48], dilation_rates=[1, 3])


def wrapper_inputs(causal: bool):
    g = torch.Generator().manual_seed(900 + int(causal))
    return [torch.randn(2, WRAPPER["N"], WRAPPER["H"], DP_SP["D"], generator=g, dtype=torch.float64) for _ in range(4)]


def multihead_wrapper_outputs(rank: int, world: int, impl: str) -> dict:
    """Per causal: this rank's out and dx shards, its parameter gradients and comm counts."""
    length = WRAPPER["N"] // world
    results = {}
    for causal in (False, True):
        module = seeded_multihead_module(
            impl,
            5,
            num_heads=WRAPPER["H"],
            segment_lengths=WRAPPER["segment_lengths"],
            dilation_rates=WRAPPER["dilation_rates"],
            process_group=torch.distributed.group.WORLD,
        )
        shard = slice(rank * length, (rank + 1) * length)
        results[causal] = sharded_outputs(module, "multihead", wrapper_inputs(causal), shard, causal)
    return results
