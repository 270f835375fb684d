"""The FlexAttention executor of block-sparse attention (attention.py): the block table as a
`BlockMask`, run by `torch.nn.attention.flex_attention` (compiled) for the whole pattern in one kernel.

CUDA forward and backward; CPU forward only (torch compiles flex on CPU for inference, without the
logsumexp). `flex_compiles_on` says whether a compiler for the device is present; `choose_executor` picks
flex or the gather executor (gather.py) for a call.
"""

from __future__ import annotations

import functools
import warnings

import torch

EXECUTORS = ("auto", "flex", "gather")


def flex_block_mask(table: torch.Tensor, seq_len: int, block_size: int, causal: bool, device: torch.device):
    """The table as a FlexAttention BlockMask: whole blocks as "full" blocks (no mask_mod evaluated),
    the causal diagonal and the ragged last row/column as partial blocks checked by mask_mod."""
    from torch.nn.attention.flex_attention import BlockMask

    num_blocks = table.shape[0]
    allowed = table.tril() if causal else table
    partial = torch.zeros_like(allowed)
    if causal:
        partial |= torch.eye(num_blocks, dtype=torch.bool)
    if seq_len % block_size:
        partial[-1, :] = True
        partial[:, -1] = True
    partial &= allowed
    full = allowed & ~partial

    def counts_and_indices(blocks: torch.Tensor):
        counts = blocks.sum(-1).to(torch.int32)
        order = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return counts[None, None].to(device), order[None, None].to(device)

    table_on_device = allowed.to(device)
    last = seq_len - 1

    def mask_mod(b, h, q_idx, kv_idx):
        ok = table_on_device[q_idx.clamp(max=last) // block_size, kv_idx.clamp(max=last) // block_size]
        ok = ok & (kv_idx <= last) & (q_idx <= last)
        return ok & (kv_idx <= q_idx) if causal else ok

    kv_num, kv_idx = counts_and_indices(partial)
    full_num, full_idx = counts_and_indices(full)
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block_size, mask_mod=mask_mod, seq_lengths=(seq_len, seq_len)
    )


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_forward(q, k, v, block_mask, scale: float, *, need_lse: bool, compiled: bool = True):
    """q, k, v (B, N, H, D) -> (out (B, N, H, D), lse (B, N, H) or None); eager when not compiled (the
    dense math of flex: for checks on small shapes)."""
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    fn = _compiled_flex() if compiled else flex_attention
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    with warnings.catch_warnings():
        if not compiled:  # eager on purpose: silence torch's "use torch.compile" advice
            warnings.simplefilter("ignore", UserWarning)
        if need_lse:
            out, aux = fn(qt, kt, vt, block_mask=block_mask, scale=scale, return_aux=AuxRequest(lse=True))
            return out.transpose(1, 2), aux.lse.transpose(1, 2)
        return fn(qt, kt, vt, block_mask=block_mask, scale=scale).transpose(1, 2), None


@functools.cache
def flex_compiles_on(device_type: str) -> bool:
    """Whether torch can compile flex attention for this device type here (triton for CUDA, a C++ compiler
    for CPU); looked up once per device type, not on every call."""
    import importlib.util
    import shutil

    if device_type == "cuda":
        return importlib.util.find_spec("triton") is not None
    return device_type == "cpu" and any(shutil.which(c) for c in ("g++", "c++", "clang++"))


def choose_executor(
    requested: str, q: torch.Tensor, world: int, need_grad: bool, need_lse: bool, masked: bool, dropout: bool
) -> tuple[str, str]:
    """(executor, why) for one call of a block-sparse module asked for `requested` (EXECUTORS); dropout: active
    in this call. ValueError when 'flex' is asked for and cannot run the call."""
    if requested == "gather":
        return "gather", "requested"
    blockers = []
    if world > 1:
        blockers.append("the ring form receives key blocks from other ranks")
    if masked:
        blockers.append("a key_padding_mask is given")
    if dropout:
        blockers.append("dropout is active")
    if q.device.type == "cpu" and need_grad:
        blockers.append("torch compiles FlexAttention on CPU for inference only")
    if q.device.type == "cpu" and need_lse:
        blockers.append("compiled CPU FlexAttention returns no logsumexp")
    if not flex_compiles_on(q.device.type):
        blockers.append(f"no compiler for FlexAttention on {q.device.type} (triton / a C++ compiler)")
    if requested == "flex":
        if blockers:
            raise ValueError(f"executor='flex' cannot run this call: {'; '.join(blockers)}; use executor='auto'")
        return "flex", "requested"
    if blockers:
        return "gather", "; ".join(blockers)
    if q.device.type == "cpu":
        return "gather", (
            "on CPU the gather path was faster than compiled FlexAttention in "
            "benchmarks/block_sparse.py; executor='flex' forces it"
        )
    return "flex", f"FlexAttention compiled for {q.device.type}"
