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
        return REGISTRY[impl].cls(
            pattern="longnet", segment_lengths=SEGS, dilation_rates=RATES, block_size=BLOCK, process_group=None
        )
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
            results[kv_heads, causal] = {
                "out": out.detach(),
                "lse": lse,
                "grads": [x.grad for x in xs],
                "comm": module.comm_stats(),
            }
    return results


# Packed documents over shards (kernels/distributed/documents.py): T = 480, documents crossing 2 and 4 shards
DOC_LENGTHS = ([7, 100, 1, 300, 57, 15], [50, 70, 90, 30, 100, 140])
DOC_HEADS, DOC_KV_HEADS = 4, 2


def doc_inputs(case: int, masked: bool):
    g = torch.Generator().manual_seed(7 + 10 * case + masked)
    T = sum(DOC_LENGTHS[case])
    q, up = (torch.randn(1, T, DOC_HEADS, D, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(1, T, DOC_KV_HEADS, D, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.rand(1, T, generator=g) < 0.2 if masked else None
    return q, k, v, up, mask


def document_cases(rank: int, world: int, impl: str):
    """Per (lengths case, causal, masked): this rank's out, lse, gradient shards and comm counts."""
    from dattn_cli.kernels.documents import offsets

    results = {}
    for case, lengths in enumerate(DOC_LENGTHS):
        T = sum(lengths)
        shard = slice(rank * T // world, (rank + 1) * T // world)
        for causal in (False, True):
            for masked in (False, True):
                q, k, v, up, mask = doc_inputs(case, masked)
                xs = [x[:, shard].clone().requires_grad_() for x in (q, k, v)]
                module = module_for(impl)
                out, lse = module.forward_with_lse(
                    *xs, causal, key_padding_mask=None if mask is None else mask[:, shard], cu_seqlens=offsets(lengths)
                )
                out.backward(up[:, shard])
                results[case, causal, masked] = {
                    "out": out.detach(),
                    "lse": lse,
                    "grads": [x.grad for x in xs],
                    "comm": module.comm_stats(),
                }
    return results


# Token sliding window over shards (halo.py): windows inside one neighbour and wider than a shard
WINDOWS = ((13, 5), (30, 0), (0, 70))


def window_cases(rank: int, world: int):
    from dattn_cli.kernels import BlockSparseRingDilatedAttention

    results = {}
    shard = slice(rank * N // world, (rank + 1) * N // world)
    for left, right in WINDOWS:
        for causal in (False, True):
            q, k, v, up = inputs(2, causal)
            mask = torch.rand(B, N, generator=torch.Generator().manual_seed(left)) < 0.2
            xs = [x[:, shard].clone().requires_grad_() for x in (q, k, v)]
            module = BlockSparseRingDilatedAttention(
                pattern="sliding_window", block_size=BLOCK, window_left=left, window_right=right
            )
            out, lse = module.forward_with_lse(*xs, causal, key_padding_mask=mask[:, shard])
            out.backward(up[:, shard])
            volume = module.comm_volume(N, H, D, B, 8, causal, masked=True, num_kv_heads=2)
            results[left, right, causal] = {
                "out": out.detach(),
                "lse": lse,
                "grads": [x.grad for x in xs],
                "comm": module.comm_stats(),
                "volume": volume,
            }
    return results


def document_bookkeeping(rank: int, world: int):
    """Ring with changing documents (a fresh cu_seqlens each call) and with one whole-sequence document."""
    from dattn_cli.kernels import RingDilatedAttention
    from dattn_cli.kernels.documents import offsets

    module = RingDilatedAttention(SEGS, RATES)
    q, k, v, _ = inputs(2, False)
    shard = slice(rank * N // world, (rank + 1) * N // world)
    xs = [x[:, shard][:1] for x in (q, k, v)]  # batch 1
    for cut in (10, 40, 70):
        module(*xs, cu_seqlens=offsets([cut, N - cut]))
    keys = len(module._consistent_keys)
    module.stats.reset()
    whole = module(*xs, cu_seqlens=offsets([N]))
    with_docs = module.comm_stats()
    module.stats.reset()
    plain = module(*xs)
    return {"keys": keys, "same": torch.equal(whole, plain), "whole": with_docs, "plain": module.comm_stats()}
