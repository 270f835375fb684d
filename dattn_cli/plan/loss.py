"""What a model's loss holds at its peak (plan/layers.py's loss phases), by `--loss`. T tokens, E the width, V the
vocabulary, c the bytes of the compute dtype, p of the weight dtype.

* standard: the whole logits tensor. Training: log-softmax's output, its gradient and the logits' gradient in fp32
  (cross_entropy upcasts half logits), 12·T·V bytes, measured on dattn's LongNet LM (docs/plan.md). Forward only:
  the logits (c), their fp32 copy where they are half, and log-softmax's output (4).
* chunked: a fused linear cross-entropy that never makes the whole logits (Liger-Kernel's FusedLinearCrossEntropy;
  ALST's tiled loss and torchtune's chunked loss do the same). The rows are cut into chunks of
  C = next_pow2(ceil(T / ceil(V / E))), at most T, so that a chunk's logits C·V are about the hidden states' T·E
  ("Bound transient logits to C x BT x H", liger_kernel/ops/fused_linear_cross_entropy.py), and the gradient is
  made in the forward, in place of the chunk's logits. Training holds one chunk's logits C·V·c, the hidden states'
  gradient T·E·c and the head weight's gradient V·E·p, summed over the chunks, and the per-token loss T·4. Forward
  only: one chunk's logits, the hidden-state gradient (Liger allocates it in every mode) and the per-token loss.
* compiled: the standard loss under torch.compile (torchtitan's `build_cross_entropy_loss` with compile on): Inductor
  fuses the upcast, log-softmax and its backward, so nothing fp32 of T·V is made: the graph keeps the logits it
  was given (c) and the backward writes their gradient (c), 2·c·T·V; forward only the logits. Measured on this
  CPU (torch 2.13, bf16, T = 4096, V = 32768, peak RSS over the live logits in a forward and backward of
  `cross_entropy(pred.float(), labels)`): eager 12.0 bytes an element, compiled 2.0 (docs/plan.md).
The head's FLOPs are the same either way (2·T·E·V forward, twice that backward): only memory changes.
"""

from __future__ import annotations

from typing import Literal

from ..workload.problem import ELEMENT_BYTES, Problem

Loss = Literal["standard", "chunked", "compiled"]


def chunk_rows(s: Problem) -> int:
    """Rows of one chunk of the chunked loss (module docstring)."""
    tokens = s.batch * s.seq_len
    factor = -(-s.vocab_size // s.width)
    return min(tokens, 1 << (-(-tokens // factor) - 1).bit_length())


def loss_items(s: Problem, loss: Loss, train: bool, tp: int = 1) -> dict[str, int]:
    """The loss's own tensors at its peak (module docstring), itemised; `tp`: a vocabulary-parallel head's share."""
    c, p = ELEMENT_BYTES[s.compute_dtype], ELEMENT_BYTES[s.dtype]
    tokens, vocab = s.batch * s.seq_len, s.vocab_size
    if loss == "compiled":
        key = "logits and their gradient (compiled loss)" if train else "logits (compiled loss)"
        return {key: (2 if train else 1) * c * tokens * vocab}
    if loss == "standard":
        if train:
            return {"log-softmax, its gradient, the logits' gradient (fp32)": 12 * tokens * vocab}
        return {"logits and log-softmax": tokens * vocab * (c + 4 + (4 if c != 4 else 0))}
    items = {
        f"chunked loss: one chunk's logits ({chunk_rows(s):,} rows)": chunk_rows(s) * vocab * c,
        # Liger allocates it whatever the mode ("grad_input = torch.zeros_like(_input)")
        "chunked loss: hidden-state gradient (made in the forward)": tokens * s.width * c,
    }
    if train:
        items["chunked loss: head weight gradient"] = vocab * s.width * p // tp
    items["chunked loss: per-token loss"] = 4 * tokens
    return items
