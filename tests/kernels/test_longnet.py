"""LongNetLM unit checks (fast): output shape and causality, gradient checkpointing is exact, bf16
autocast on CPU, the "subln" (MAGNETO) layout, and argument validation naming the bad parameter."""

import math

import pytest
import torch

from dattn_cli.models.longnet import LongNetLM
from tests.conftest import rel_err

VOCAB, N = 11, 40  # N = 40 is not a multiple of 16: the ragged tail segment is exercised too


def tiny(**kw):
    cfg = dict(segment_lengths=[8, 16], dilation_rates=[1, 2])
    cfg.update(kw)
    return LongNetLM(VOCAB, 16, 2, 2, **cfg)


def batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (2, N), generator=gen), torch.randint(0, VOCAB, (2, N), generator=gen)


def test_logits_shape_and_causality():
    model = tiny()
    tokens, _ = batch()
    logits = model(tokens)
    assert logits.shape == (2, N, VOCAB)
    changed = tokens.clone()
    changed[:, 30:] = (changed[:, 30:] + 1) % VOCAB
    after = model(changed)
    assert torch.equal(logits[:, :30], after[:, :30]), "a later token changed an earlier position's logits"
    assert not torch.allclose(logits[:, 30:], after[:, 30:])


@pytest.mark.slow
def test_checkpointing_gives_the_same_loss_and_grads():
    plain = tiny()
    ckpt = tiny(checkpointing=True)
    ckpt.load_state_dict(plain.state_dict())
    tokens, targets = batch()
    targets[0, :5] = -100
    results = []
    for model in (plain, ckpt):
        loss = model.loss(tokens, targets)
        results.append((loss, torch.autograd.grad(loss, list(model.parameters()))))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert rel_err(loss_b, loss_a) <= 1e-6
    assert len(grads_a) == len(grads_b) > 0
    for (name, _), ga, gb in zip(plain.named_parameters(), grads_a, grads_b):
        assert ga.abs().max() > 0 or name.endswith("bias"), f"{name} got no gradient"
        assert rel_err(gb, ga) <= 1e-6, name


def test_bf16_autocast_on_cpu_gives_finite_loss_and_grads():
    model = tiny()
    tokens, targets = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model.loss(tokens, targets)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert abs(loss.item() - model.loss(tokens, targets).item()) < 0.1  # bf16 rounding only
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.slow
def test_subln_builds_runs_and_trains():
    model = tiny(norm="subln")
    assert model.blocks[0].mlp_inner_norm is not None and model.blocks[0].attn.norm is not None
    tokens, targets = batch()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = None
    for _ in range(20):  # memorise one batch: the loss must drop
        loss = model.loss(tokens, targets)
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert math.isfinite(first) and loss.item() < 0.8 * first


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(norm="post"), "norm"),
        (dict(attention="NoSuchImpl"), "attention"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(num_layers=0), "num_layers"),
        (dict(dropout=1.0), "dropout"),
    ],
)
def test_bad_arguments_raise_value_error_naming_the_parameter(kwargs, name):
    cfg = dict(vocab_size=VOCAB, embed_dim=16, num_heads=2, num_layers=1, segment_lengths=[8], dilation_rates=[1])
    cfg.update(kwargs)
    with pytest.raises(ValueError, match=name):
        LongNetLM(**cfg)


@pytest.mark.parametrize(
    "tokens", [torch.zeros(2, 8), torch.zeros(2, 8, dtype=torch.int32), torch.zeros(8, dtype=torch.long)]
)
def test_bad_tokens_raise_value_error(tokens):
    with pytest.raises(ValueError, match="tokens"):
        tiny()(tokens)


def test_packed_documents_give_each_document_its_own_logits():
    """LongNetLM(tokens, cu_seqlens=...) on packed documents equals the model on each document alone (rotary
    positions restart per document; GQA blocks), with checkpointing too."""
    from dattn_cli.kernels.documents import offsets
    from dattn_cli.models import LongNetLM

    torch.manual_seed(0)
    model = LongNetLM(50, 32, 4, 2, segment_lengths=[8, 16], dilation_rates=[1, 2], num_kv_heads=2, dtype=torch.float64)
    lengths = [5, 20, 1, 14]
    tokens = torch.randint(0, 50, (1, sum(lengths)))
    separate, at = [], 0
    for n in lengths:
        separate.append(model(tokens[:, at : at + n]))
        at += n
    for checkpointing in (False, True):
        model.checkpointing = checkpointing
        packed = model(tokens, cu_seqlens=offsets(lengths))
        torch.testing.assert_close(packed, torch.cat(separate, 1), rtol=1e-12, atol=1e-12)
