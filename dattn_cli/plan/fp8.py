"""plan --fp8 KIND: the blocks' linear layers in FP8, as TransformerEngine or torchao run them (a named model's
decoder layers; the embedding, the output head, the attention and the norms stay in the compute dtype).

te: TransformerEngine's te.Linear under fp8_autocast, per-tensor scaling on Hopper
(transformer_engine/pytorch/module/linear.py, `_linear_forward_impl` and `_Linear.forward`):
* each linear saves its input as an FP8 tensor, 1 byte an element, its transposed copy only ("Discard row-wise
  data since it is not needed in backward pass"), in place of the compute-dtype tensor: q, k and v each their
  own copy of the attention norm's output, gate and up (fc1) theirs of the MLP norm's, down its input (the MLP's
  product, then not kept in the compute dtype), o_proj a copy of the attention output (which the core keeps);
* each weight in FP8 and its transpose, 2 bytes a matmul parameter, made in the forward (`quantize_weight`,
  module/base.py) and saved for the backward (`wt_save`), instead of autocast's half copies of the weights.
TE's docs say so: "FP8 training does not always reduce memory compared to BF16/FP16"
(docs/features/low_precision_training/performance_considerations). Delayed scaling's amax history, about 20 KB
a linear, is left out.

torchao: torchao.float8's Float8Linear with tensorwise scaling, torchtitan's float8 converter
(torchao/float8/float8_linear.py: `matmul_with_hp_or_float8_args` saves `input_hp, weight_hp_t`): the saved set
is unchanged (eager; under torch.compile the partitioner may keep float8 copies instead: not modelled). With
ZeRO-3/FSDP the weights are all-gathered in float8 (enable_fsdp_float8_all_gather, torchao/float8/fsdp_utils.py
`fsdp_pre_all_gather`): the gathered units and the all-gathers carry 1 byte a matmul parameter.

Time, both: the blocks' linear FLOPs at the profile's float8 peak x the matmul efficiency (`matmul:float8` where
plan --calibrate fitted it, else the compute dtype's), plus the casts at memory bandwidth: in the forward each
linear reads its input in the compute dtype and writes two FP8 copies (row-wise and transposed), c + 2 bytes an
element, and its weight, p + 2 bytes a parameter; in the backward its output gradient, c + 2 bytes an element.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from ..workload.architecture import block_matmul_parameters, block_matmuls
from ..workload.problem import ELEMENT_BYTES, Problem

if TYPE_CHECKING:
    from .profiles import HardwareProfile

Fp8 = Literal["te", "torchao"]
MATMUL_KEY = "matmul:float8"


def kind(s: Problem) -> str | None:
    return s.architecture.fp8 if s.architecture is not None else None


def saves_fp8(s: Problem) -> bool:
    """Whether the linears keep FP8 copies of their inputs (TransformerEngine) rather than the compute dtype's."""
    return kind(s) == "te"


def weight_copies(s: Problem) -> int:
    """TransformerEngine's FP8 weight and its transpose, one block's (module docstring); 0 otherwise."""
    return 2 * block_matmul_parameters(s) if saves_fp8(s) else 0


def gathered_matmul_bytes(s: Problem) -> int:
    """Bytes one matmul parameter takes in an FSDP all-gather: 1 with torchao's float8 all-gather, else p."""
    return 1 if kind(s) == "torchao" else ELEMENT_BYTES[s.dtype]


def linear_seconds(s: Problem, profile: HardwareProfile, flops: float, efficiency_of) -> float:
    """`flops` of the linear layers (recomputation included), the blocks' share at the float8 rate and the head's at
    the compute dtype's, plus the casts (module docstring). `efficiency_of(key)`: the profile's matmul efficiency."""
    per_token = block_matmul_parameters(s)
    head = s.width * s.vocab_size if s.target == "model" else 0
    blocks = flops * s.layers * per_token / (s.layers * per_token + head)
    peak8 = profile.required_peak("float8", "drop --fp8, or give the profile a peak_tflops.float8")
    fitted = MATMUL_KEY in profile.efficiency.per_impl or f"{MATMUL_KEY}/{s.mode}" in profile.efficiency.per_impl
    gemm8 = blocks / (peak8 * efficiency_of(MATMUL_KEY if fitted else f"matmul:{s.compute_dtype}"))
    rest = (flops - blocks) / (profile.required_peak(s.compute_dtype) * efficiency_of(f"matmul:{s.compute_dtype}"))
    c, p = ELEMENT_BYTES[s.compute_dtype], ELEMENT_BYTES[s.dtype]
    train = s.mode == "fwdbwd"
    element_bytes = sum(i + (o if train else 0) for _, o, i, _ in block_matmuls(s)) * (c + 2)
    token_layers = blocks / (2.0 * per_token * (3 if train else 1))  # tokens x blocks run, recomputation included
    casts = token_layers * element_bytes + s.layers * per_token * (p + 2)
    return gemm8 + rest + profile.memory_seconds(casts)


def check(s: Problem, profile: HardwareProfile) -> None:
    """--fp8 plans a named model's decoder layers with a half-precision compute dtype on a device with a float8 rate
    (bad input: one line)."""
    if kind(s) is None:
        return
    if s.compute_dtype not in ("bfloat16", "float16"):
        raise ValueError(
            f"--fp8 runs the rest of the step in a half precision, not {s.compute_dtype}: give --dtype bfloat16 "
            "or --amp bf16"
        )
    if s.arch.tiled_mlp:
        raise ValueError("--fp8 with --tiled-mlp is not modelled (the tiles keep the MLP's input themselves): drop one")
    profile.required_peak("float8", "drop --fp8, or give the profile a peak_tflops.float8")
