"""Rank functions for layout="documents" (kernels/distributed/document_layout.py): each rank shards the packed
documents of gqa_workers' document cases with shard_sequence(x, layout=document_layout(...)), runs a ring or
all-gather module of layout="documents", and returns its shard of outputs and gradients."""

from dattn_cli.kernels import document_layout, gather_sequence, shard_sequence
from dattn_cli.kernels.documents import offsets
from tests.distributed import gqa_workers as w

# impl -> gqa_workers' document length cases it runs (one for the all-gather, which shares the ring's code path)
IMPLS = {"RingDilatedAttention": (0, 1), "DistributedImprovedDilatedAttention": (1,)}
VARIANTS = ((False, True), (True, False))  # (causal, masked)


def balanced_cases(rank: int, world: int):
    """Per (impl, lengths case, causal, masked): this rank's out, lse, gradient shards, the gathered output."""
    from dattn_cli.kernels import REGISTRY

    results = {}
    for impl, cases in IMPLS.items():
        for case in cases:
            lengths = w.DOC_LENGTHS[case]
            cu = offsets(lengths)
            layout = document_layout(cu, world, w.SEGS)
            for causal, masked in VARIANTS:
                q, k, v, up, mask = w.doc_inputs(case, masked)
                shards = [shard_sequence(x, key_padding_mask=mask, layout=layout) for x in (q, k, v, up)]
                xs = [s.clone().requires_grad_() for s, _ in shards[:3]]
                module = REGISTRY[impl].cls(w.SEGS, w.RATES, layout="documents")
                out, lse = module.forward_with_lse(*xs, causal, key_padding_mask=shards[0][1], cu_seqlens=cu)
                out.backward(shards[3][0])
                results[impl, case, causal, masked] = {
                    "out": out.detach(),
                    "lse": lse.detach(),
                    "grads": [x.grad for x in xs],
                    "gathered": gather_sequence(out, sum(lengths), layout=layout),
                    "comm": module.comm_stats(),
                }
    return results
