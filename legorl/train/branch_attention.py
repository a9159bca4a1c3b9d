"""A shared-prefix branch's attention on CPU without a mask: prefix part and own part, merged.

A branch (shared_prefix.py) runs its q_len queries on top of the prefix's cached keys, so its
attention is the last q_len rows of a causal k_len × k_len triangle. SDPA's `is_causal` aligns
its triangle top-left, so varlen.py gives that case an explicit (q_len × k_len) mask, and a
masked SDPA reads the whole mask and skips no block: on the quickstart's model (attention is
nearly all of a step there) the branches' masked attention was most of a shared step.

Split by keys instead, the two parts need no mask: the queries see every prefix key (plain
attention) and the branch's own keys causally with q_len == k_len (top-left is then right).
Each part returns its log-sum-exp; the softmax over all keys is the parts' outputs weighted by
exp(lse_part - lse_all). The backward is FlashAttention's split-KV one: each part's kernel
backward, given the *merged* output and log-sum-exp, yields exactly the joint softmax's gradient
for its own keys, and the queries' gradients add. So the result equals the masked computation
(tests/train/test_train_branch_attention.py: outputs and gradients against it, GQA included).

CPU only (`_scaled_dot_product_flash_attention_for_cpu` is the kernel that returns the log-sum-
exp); elsewhere, and with dropout, varlen.py keeps the masked call.
"""

from __future__ import annotations

from typing import Any

import torch

_FORWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
_NEUTRAL = ("is_causal", "position_ids", "use_cache")  # keyword arguments that do not change the softmax


class _SplitAttention(torch.autograd.Function):
    """softmax over [prefix keys ; own keys (causal)], computed as two unmasked kernels."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q_B_H_Q_D: torch.Tensor,
        kp_B_H_P_D: torch.Tensor,
        vp_B_H_P_D: torch.Tensor,
        kb_B_H_Q_D: torch.Tensor,
        vb_B_H_Q_D: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        out_p, lse_p_B_H_Q = _FORWARD(q_B_H_Q_D, kp_B_H_P_D, vp_B_H_P_D, 0.0, False, scale=scale)
        out_b, lse_b_B_H_Q = _FORWARD(q_B_H_Q_D, kb_B_H_Q_D, vb_B_H_Q_D, 0.0, True, scale=scale)
        lse_B_H_Q = torch.logaddexp(lse_p_B_H_Q, lse_b_B_H_Q)
        out = (
            torch.exp(lse_p_B_H_Q - lse_B_H_Q)[..., None] * out_p
            + torch.exp(lse_b_B_H_Q - lse_B_H_Q)[..., None] * out_b
        )
        ctx.save_for_backward(q_B_H_Q_D, kp_B_H_P_D, vp_B_H_P_D, kb_B_H_Q_D, vb_B_H_Q_D, out, lse_B_H_Q)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        q, kp, vp, kb, vb, out, lse = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        dq_p, dkp, dvp = _BACKWARD(grad_out, q, kp, vp, out, lse, 0.0, False, scale=ctx.scale)
        dq_b, dkb, dvb = _BACKWARD(grad_out, q, kb, vb, out, lse, 0.0, True, scale=ctx.scale)
        return dq_p + dq_b, dkp, dvp, dkb, dvb, None


def usable(query: torch.Tensor, dropout: float, kwargs: dict[str, object]) -> bool:
    """Whether the split computes what the masked call would: on CPU, without dropout, and
    with nothing else (soft-capping, sinks, a window) changing the softmax."""
    extra = {k for k, v in kwargs.items() if k not in _NEUTRAL and v is not None and v is not False}
    return query.device.type == "cpu" and dropout == 0.0 and not extra


def branch_attention(
    query_B_H_Q_D: torch.Tensor, key_B_G_K_D: torch.Tensor, value_B_G_K_D: torch.Tensor, scaling: float | None
) -> torch.Tensor:
    """Attention of the last Q of K positions (the first K - Q are a cached prefix), causal,
    as (B, Q, H, D) like transformers' attention functions return it. G key/value heads
    serve H query heads (grouped-query attention): repeated here, so their gradients sum."""
    heads, kv_heads = query_B_H_Q_D.shape[1], key_B_G_K_D.shape[1]
    if heads != kv_heads:
        key_B_G_K_D = key_B_G_K_D.repeat_interleave(heads // kv_heads, dim=1)
        value_B_G_K_D = value_B_G_K_D.repeat_interleave(heads // kv_heads, dim=1)
    q_len, k_len = query_B_H_Q_D.shape[2], key_B_G_K_D.shape[2]
    split = k_len - q_len
    scale = scaling if scaling is not None else query_B_H_Q_D.shape[-1] ** -0.5
    out_B_H_Q_D = _SplitAttention.apply(
        query_B_H_Q_D.contiguous(),
        key_B_G_K_D[:, :, :split].contiguous(),
        value_B_G_K_D[:, :, :split].contiguous(),
        key_B_G_K_D[:, :, split:].contiguous(),
        value_B_G_K_D[:, :, split:].contiguous(),
        scale,
    )
    return out_B_H_Q_D.transpose(1, 2).contiguous()
