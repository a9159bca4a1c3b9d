"""A shared-prefix branch's split attention equals the masked computation it replaces."""

from __future__ import annotations

import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention

from legorl.train.branch_attention import branch_attention, usable
from legorl.train.varlen import causal_mask


def masked_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """The bottom-right causal mask over [prefix ; branch], as varlen.py's masked call runs it."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    mask = causal_mask(q.shape[2], k.shape[2], None, q.dtype, q.device)
    return scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).transpose(1, 2)


@pytest.mark.parametrize(
    ("batch", "heads", "kv_heads", "prefix", "branch"),
    [(1, 4, 4, 300, 70), (2, 4, 2, 129, 1), (1, 6, 1, 64, 200)],
)
def test_split_equals_masked_outputs_and_gradients(
    batch: int, heads: int, kv_heads: int, prefix: int, branch: int
) -> None:
    torch.manual_seed(0)
    dim, scale = 16, 0.3
    q = torch.randn(batch, heads, branch, dim, dtype=torch.float64, requires_grad=True)
    k = torch.randn(batch, kv_heads, prefix + branch, dim, dtype=torch.float64, requires_grad=True)
    v = torch.randn(batch, kv_heads, prefix + branch, dim, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(batch, branch, heads, dim, dtype=torch.float64)

    def run(f) -> tuple[torch.Tensor, list[torch.Tensor]]:  # type: ignore[no-untyped-def]
        out = f(q, k, v, scale)
        grads = torch.autograd.grad((out * upstream).sum(), [q, k, v])
        return out.detach(), list(grads)

    out, grads = run(branch_attention)
    ref, ref_grads = run(masked_reference)
    assert out.shape == (batch, branch, heads, dim)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    for name, g, r in zip("qkv", grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-10, msg=f"d{name}")


def test_split_is_used_only_where_it_is_the_same_softmax() -> None:
    q = torch.zeros(1, 2, 3, 4)
    assert usable(q, 0.0, {"is_causal": True, "sliding_window": None, "use_cache": True})
    assert not usable(q, 0.1, {})  # dropout: the masked call's
    assert not usable(q, 0.0, {"softcap": 30.0})  # anything else changing the softmax
    assert not usable(q.to("meta"), 0.0, {})  # the log-sum-exp kernel is CPU's
