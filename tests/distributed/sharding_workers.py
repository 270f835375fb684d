"""Rank functions (module level, so rank processes import them) for any N over any p: each rank takes its
shard from shard_sequence (the sequence padded at the end, the padding masked), runs a distributed class,
and returns its whole padded shard of outputs and gradients for the caller to check against the reference.
Kept apart from workers.py, which other suites append to."""

import torch

from dattn_cli.kernels import gather_sequence, shard_sequence

B, D = 2, 8
N, SEGMENTS, RATES = 50, [8, 20], [1, 2]  # N % p != 0 and N/p neither divides nor is a multiple of 8 or 20
# the patterns of the core checks: [8, 20] pads to segments that fit in shards (no bytes move); in [10, 100]
# ŵ = N' spans every rank, so the padded buffers travel
PATTERNS = [(SEGMENTS, RATES), ([10, 100], [1, 3])]
PADDED_VARIANTS = [
    (sem, causal, masked) for sem in ("longnet", "head_groups") for causal in (False, True) for masked in (False, True)
]
CORE_IMPLS = ["RingDilatedAttention", "DistributedImprovedDilatedAttention", "HeadParallelDilatedAttention"]
# block-sparse: (module options, N); block size 8, so the last real block is ragged and gets padded rows.
# head_groups longnet with r = 8 on N = 49: a padded row (49) is kept where the real row 48 is not, so a table
# of the padded length would let row 48 attend blocks the real pattern does not (seq_len= prevents it);
# density 0.47: the window follows the number of blocks, 1 for the 7 real ones, 2 for 8 or 9 padded ones.
BS_PADDED = [
    (dict(pattern="longnet", segment_lengths=[16, 64], dilation_rates=[1, 8], semantics="head_groups"), 49),
    (dict(pattern="local", density=0.47), 50),
    (dict(pattern="dilated", segment_lengths=[8, 20], dilation_rates=[1, 2]), 50),
]


def heads_for(world: int) -> int:
    return 6 if world == 3 else 4  # head-parallel splits heads evenly


def full_inputs(seed: int, n: int, heads: int, masked: bool):
    g = torch.Generator().manual_seed(seed)
    q, k, v, up = (torch.randn(B, n, heads, D, generator=g, dtype=torch.float64) for _ in range(4))
    mask = (torch.rand(B, n, generator=g) < 0.3) if masked else None
    return q, k, v, up, mask


def _run_core(module, inputs, causal, sharding, real_len=None):
    """This rank's (out, lse, dq, dk, dv) over its padded shard, and the mask it was given."""
    q, k, v, up, mask = inputs
    shards = [shard_sequence(x, **sharding, key_padding_mask=mask) for x in (q, k, v, up)]
    padding = shards[0][1]
    xs = [s.float().requires_grad_() for s, _ in shards[:3]]
    extra = {} if real_len is None else {"seq_len": real_len}
    out, lse = module.forward_with_lse(*xs, causal, key_padding_mask=padding, **extra)
    grads = torch.autograd.grad(out, xs, shards[3][0].float())
    return {
        "out": out.detach(),
        "lse": lse.detach(),
        "grads": [g.detach() for g in grads],
        "mask": padding,
        "gathered": gather_sequence(out.detach(), q.shape[1]),
        "comm": module.comm_stats(),
    }


def padded_core_cases(rank: int, world: int):
    """Per (impl, pattern, variant): this rank's results for the ring, all-gather and head-parallel classes."""
    from dattn_cli.kernels import REGISTRY

    results = {}
    for impl in CORE_IMPLS:
        for c, (segments, rates) in enumerate(PATTERNS):
            sharding = {} if impl.startswith("HeadParallel") else {"segment_lengths": segments}
            for i, (sem, causal, masked) in enumerate(PADDED_VARIANTS):
                module = REGISTRY[impl].cls(segments, rates, semantics=sem)
                inputs = full_inputs(100 * i + 10 * c + world, N, heads_for(world), masked)
                results[impl, c, i] = _run_core(module, inputs, causal, sharding)
    return results


def padded_block_sparse_cases(rank: int, world: int):
    from dattn_cli.kernels import BlockSparseRingDilatedAttention

    results = {}
    for c, (options, n) in enumerate(BS_PADDED):
        for causal in (False, True):
            module = BlockSparseRingDilatedAttention(block_size=8, **options)
            inputs = full_inputs(10 * c + causal, n, 3, masked=c == 2)
            result = _run_core(module, inputs, causal, {"block_size": 8}, real_len=n)
            padded = result["out"].shape[1] * world
            result["expected"] = module.comm_volume(n, 3, D, B, 4, causal, masked=True, padded_len=padded)
            results[c, causal] = result
    return results


def multihead_weights(seed: int = 0):
    from dattn_cli.kernels import RingMultiheadDilatedAttention

    torch.manual_seed(seed)
    return RingMultiheadDilatedAttention(16, 4, segment_lengths=SEGMENTS, dilation_rates=RATES)


def multihead_inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    x, up = (torch.randn(B, N, 16, generator=g, dtype=torch.float64) for _ in range(2))
    return x, up, torch.rand(B, N, generator=g) < 0.2


def padded_multihead_cases(rank: int, world: int):
    """RingMultiheadDilatedAttention on padded shards: out, dx and the parameter gradients of this rank."""
    results = {}
    for causal in (False, True):
        module = multihead_weights()
        x, up, mask = multihead_inputs(int(causal))
        xs, padding = shard_sequence(x, segment_lengths=SEGMENTS, key_padding_mask=mask)
        ups, _ = shard_sequence(up, segment_lengths=SEGMENTS)
        xs = xs.float().requires_grad_()
        out, _ = module(xs, xs, xs, is_causal=causal, key_padding_mask=padding)
        grads = torch.autograd.grad(out, [xs, *module.parameters()], ups.float())
        results[causal] = {
            "out": out.detach(),
            "dx": grads[0],
            "dparams": torch.cat([g.flatten() for g in grads[1:]]).double(),
        }
    return results


def round_trip(rank: int, world: int):
    """shard_sequence then gather_sequence on (B, N, E) and on the sequence at dim 2, with and without a mask."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 50, 3, generator=g)
    user = torch.rand(2, 50, generator=g) < 0.5
    shard, mask = shard_sequence(x, segment_lengths=SEGMENTS)
    masked_shard, user_mask = shard_sequence(x, segment_lengths=SEGMENTS, key_padding_mask=user)
    y = x.transpose(1, 2).contiguous()  # (B, E, N): the sequence at dim 2
    y_shard, _ = shard_sequence(y, block_size=8, dim=2)
    return {
        "shard": shard,
        "mask": mask,
        "user_mask": user_mask,
        "same": torch.equal(shard, masked_shard),
        "back": gather_sequence(shard, 50),
        "back_dim2": gather_sequence(y_shard, 50, dim=2),
    }


def gather_mismatched(rank: int, world: int):
    gather_sequence(torch.zeros(1, 4 + rank, 2), 4)
