"""The router of a mixture-of-experts layer: softmax over the experts, the top k, renormalized.

``route`` takes the router's logits (torch on the CPU, one Triton launch on CUDA);
``route_fused`` also computes the logits, in the same launch, for decode-sized batches: each
program computes a few logits of one token into a scratch row and counts itself done on the
token's counter, and the last one to finish routes the row. Its logits are summed in another
order than the linear layer's, and in an order that depends on the launch's token count
(``router_rows``), as the skinny GEMMs' split depends on their row bucket: a graph of a padded
size and an eager step of the real size may route a near tie apart by one bf16 rounding.
"""

from __future__ import annotations

import torch
from torch import nn

from cadence.model.moe_kernels import _moe_route_kernel, _moe_router_kernel
from cadence.runtime.triton_launch import TritonLaunch, next_pow2

try:
    import triton
except ImportError:  # pragma: no cover - CPU installs
    triton = None

__all__ = ["ROUTER_MAX_TOKENS", "route", "route_fused", "route_hidden", "route_triton",
           "router_rows"]

# The routing kernels hold all of a token's experts in one program: up to this many.
MAX_EXPERTS = 1024

if triton is not None:
    _ROUTE = TritonLaunch(_moe_route_kernel)
    _ROUTER = TritonLaunch(_moe_router_kernel)


def route(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights [T, k], expert ids [T, k])``: softmax in float32 over all experts, the top k,
    renormalized to sum to one when ``renormalize``; weights in the logits' dtype. On CUDA one
    Triton launch (route_triton; among exactly equal probabilities the lower id first)."""
    if triton is not None and router_logits.is_cuda and router_logits.shape[-1] <= MAX_EXPERTS:
        return route_triton(router_logits, top_k, renormalize)
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids


def route_triton(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    tokens, experts = router_logits.shape
    weights = torch.empty((tokens, top_k), dtype=router_logits.dtype, device=router_logits.device)
    ids = torch.empty((tokens, top_k), dtype=torch.long, device=router_logits.device)
    if tokens:
        _ROUTE((tokens,), (router_logits, weights, ids, router_logits.stride(0)),
               NUM_EXPERTS=experts, TOP_K=top_k, BLOCK_K=next_pow2(top_k),
               BLOCK_E=next_pow2(experts, 16), RENORMALIZE=renormalize, num_warps=1)
    return weights, ids


# Up to this many tokens route_fused computes the router's logits and routes them in one
# launch (a decode step's batch); more take the linear layer and then route().
ROUTER_MAX_TOKENS = 32
# Router rows (experts) per program of route_fused: H200, Qwen3-30B-A3B's router (128 x 2048),
# us for 1 / 8 / 32 tokens (scripts/moe_sweep.py --router): 1 row 5.97 / 6.43 / 10.38, 8 rows
# 6.80 / 6.89 / 7.57; the linear layer and route() 7.59 / 8.13 / 8.27.
def router_rows(tokens: int) -> int:
    return 1 if tokens <= 8 else 8


def route_fused(
    x: torch.Tensor, gate: torch.Tensor, top_k: int, renormalize: bool, counter: torch.Tensor,
    rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``route(x @ gate.T, top_k, renormalize)`` in one Triton launch for ``x [T, H]`` and the
    router's ``gate [E, H]`` (one dtype): ``E / rows`` programs per token each compute ``rows``
    logits (``router_rows`` by default), and the token's last program to finish routes them.
    ``counter`` is an int32 tensor of at least ``T`` zeros that the launch leaves at zero (one
    per module; launches that share it must not run concurrently)."""
    tokens, hidden = x.shape
    experts = gate.shape[0]
    weights = torch.empty((tokens, top_k), dtype=x.dtype, device=x.device)
    ids = torch.empty((tokens, top_k), dtype=torch.long, device=x.device)
    if tokens == 0:
        return weights, ids
    if counter.numel() < tokens or counter.dtype != torch.int32:
        raise ValueError(f"route_fused needs an int32 counter of at least {tokens} entries")
    rows = rows or router_rows(tokens)
    logits = torch.empty((tokens, experts), dtype=torch.float32, device=x.device)
    x, gate = x.contiguous(), gate.contiguous()
    _ROUTER((tokens, triton.cdiv(experts, rows)),
            (x, gate, logits, counter, weights, ids, x.stride(0), gate.stride(0)),
            HIDDEN=hidden, NUM_EXPERTS=experts, TOP_K=top_k, BLOCK_R=rows,
            BLOCK_H=min(4096 // rows, next_pow2(hidden, 16)), BLOCK_K=next_pow2(top_k),
            BLOCK_E=next_pow2(experts, 16), RENORMALIZE=renormalize, num_warps=4)
    return weights, ids


def route_hidden(
    x: torch.Tensor, gate: nn.Linear, top_k: int, renormalize: bool, counter: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``route(gate(x), top_k, renormalize)``: in one launch (``route_fused``) for up to
    ``ROUTER_MAX_TOKENS`` tokens on CUDA with the router in ``x``'s dtype and no bias, else the
    linear layer and then ``route``."""
    w = gate.weight
    if (triton is not None and x.is_cuda and x.shape[0] <= ROUTER_MAX_TOKENS
            and gate.bias is None and w.dtype == x.dtype and w.shape[0] <= MAX_EXPERTS):
        return route_fused(x, w, top_k, renormalize, counter)
    return route(gate(x), top_k, renormalize)
