"""Selective activation recompute, `plan --recompute selective`: torchtitan's op-level policy
(torchtitan/distributed/activation_checkpoint.py: `_save_list` and the policy that saves "every other mm").
Each block runs under torch.utils.checkpoint with a selective-checkpoint context
(torch.utils.checkpoint.create_selective_checkpoint_contexts) that keeps the outputs of the attention kernel
(aten._scaled_dot_product_{flash,efficient,cudnn}_attention: out and lse) and of every other aten.mm of the block
(the 1st, 3rd, ... in the order q, k, v, o, gate, up, down; a projection with a bias runs aten.addmm, which is
neither kept nor counted), and recomputes every other op in the backward: the norms, rotary, the activation, the
other matmuls.

Memory (plan/layers.py's phases): a block waiting for its backward keeps its input T·E·p, as under full
checkpointing, and the kept outputs; the block in its backward holds its whole saved set again, as under full
checkpointing (the recomputation takes the kept outputs out of the cache, so they are not held twice).
Time: the recomputed matmuls' forward FLOPs, 2·T·(their weights), are added to the linear work; the attention is
kept, not recomputed.

A named architecture's block only (plan --model, --model-config): dattn's LongNet block runs addmm and its own
attention, of which the policy keeps nothing (that is --recompute full).
"""

from __future__ import annotations

from typing import Literal

from ..workload.architecture import block_matmuls
from ..workload.problem import ELEMENT_BYTES, Problem

Recompute = Literal["none", "full", "selective"]


def kept_matmuls(s: Problem) -> tuple[list[str], list[str]]:
    """(kept, recomputed) projection names: of those without a bias (aten.mm), the 1st, 3rd, ... are kept."""
    plain = [name for name, *_, bias in block_matmuls(s) if not bias]
    kept = plain[0::2]
    return kept, [name for name, *_ in block_matmuls(s) if name not in kept]


def kept_outputs(s: Problem) -> dict[str, int]:
    """What a block waiting for its backward keeps besides its input, itemised."""
    c, tokens = ELEMENT_BYTES[s.compute_dtype], s.batch * s.seq_len
    kept, _ = kept_matmuls(s)
    widths = {name: out for name, out, *_ in block_matmuls(s)}
    return {
        f"kept matmul outputs ({', '.join(kept)})": sum(widths[name] for name in kept) * tokens * c,
        "kept attention output and lse": tokens * (s.attention_width * c + s.heads * 4),
    }


def recomputed_linear_flops(s: Problem) -> float:
    """Forward FLOPs of the projections the backward runs again, per block: 2·T·(their weights)."""
    _, recomputed = kept_matmuls(s)
    sizes = {name: out * inp for name, out, inp, _ in block_matmuls(s)}
    return 2.0 * s.batch * s.seq_len * sum(sizes[name] for name in recomputed)


def check(s: Problem, recompute: Recompute | None) -> None:
    """A given recompute mode agrees with the Problem (full is its checkpointing; None: the Problem's); selective
    needs a named architecture's block, not tiled; a tiled MLP is modelled without autocast (bad input: one line,
    exit 2)."""
    if recompute is not None and (recompute == "full") != s.checkpointing:
        raise ValueError(
            f"--recompute {recompute} and checkpointing={s.checkpointing} disagree: full is --checkpointing"
        )
    if recompute == "selective" and s.architecture is None:
        raise ValueError(
            "--recompute selective keeps matmul and attention-kernel outputs of a named model's block (--model or "
            "--model-config); dattn's LongNet block has neither: use --recompute full"
        )
    if recompute == "selective" and s.arch.tiled_mlp:
        raise ValueError(
            "--recompute selective with --tiled-mlp is not modelled (the tiles change which matmuls it keeps): drop one"
        )
    if s.arch.tiled_mlp and s.amp:
        raise ValueError(
            "--tiled-mlp with --amp is not modelled (the tiled backward runs outside autocast, in the "
            "weights' dtype): give --dtype bfloat16 without --amp, or drop --tiled-mlp"
        )
