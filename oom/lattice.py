"""Transducer lattice log-likelihoods in plain torch: RNN-T (Graves 2012) and TDT
(token-and-duration transducer, Xu et al. 2023).

Inputs are log-probabilities already gathered from the joint output (the B x T' x (U + 1) x V
tensor never enters here): ``blank`` (B, T', U + 1), ``label`` (B, T', U) and, for TDT,
``duration`` (B, T', U + 1, D). The forward variable is vectorized over u (a linear
recurrence in log space, ``logcumsumexp``); the loop runs over frames; float64.

:class:`TransducerNLL` is the autograd function (backward recomputes the recursion). On fake
tensors it allocates only its outputs and gradients, so the traced program does not depend
on the shape.
"""

from __future__ import annotations

from typing import Any

import torch

NEG_INF = float("-inf")


def is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return bool(is_fake(t))


def _row(a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """alpha[u] = logsumexp_{k<=u} (a[k] + sum_{k<=j<u} c[j]); ``a`` (B, U+1), ``c`` (B, U)."""
    big_c = torch.cat([torch.zeros_like(a[:, :1]), torch.cumsum(c, dim=1)], dim=1)
    return big_c + torch.logcumsumexp(a - big_c, dim=1)


def rnnt_log_likelihood(
    blank: torch.Tensor, label: torch.Tensor, frame_lens: torch.Tensor, target_lens: torch.Tensor
) -> torch.Tensor:
    """Per-sample RNN-T log-likelihood (B,) of the targets (lengths in frames / tokens)."""
    blank, label = blank.double(), label.double()
    b, t_max, _ = blank.shape
    alphas = []
    prev = None
    for t in range(t_max):
        if prev is None:
            a = torch.full_like(blank[:, 0], NEG_INF)
            a[:, 0] = 0.0
        else:
            a = prev + blank[:, t - 1]
        prev = _row(a, label[:, t])
        alphas.append(prev)
    alpha = torch.stack(alphas, dim=1)  # (B, T', U+1)
    idx = torch.arange(b, device=blank.device)
    last_t, last_u = frame_lens - 1, target_lens
    return alpha[idx, last_t, last_u] + blank[idx, last_t, last_u]


def tdt_log_likelihood(
    blank: torch.Tensor,
    label: torch.Tensor,
    duration: torch.Tensor,
    durations: tuple[int, ...],
    frame_lens: torch.Tensor,
    target_lens: torch.Tensor,
) -> torch.Tensor:
    """Per-sample TDT log-likelihood (B,). A blank advances by a duration d >= 1, a label
    by any d in ``durations`` (d = 0 stays on the frame); the lattice ends at frame T'."""
    blank, label, duration = blank.double(), label.double(), duration.double()
    b, t_max, u1 = blank.shape
    neg = torch.full_like(blank[:, 0], NEG_INF)
    alphas: list[torch.Tensor] = []
    for t in range(t_max):
        terms = [neg.clone()]
        if t == 0:
            terms[0][:, 0] = 0.0
        for k, d in enumerate(durations):
            if d < 1 or t - d < 0:
                continue
            src = alphas[t - d]
            terms.append(src + blank[:, t - d] + duration[:, t - d, :, k])
            lab = torch.cat([neg[:, :1], src[:, :-1] + label[:, t - d] + duration[:, t - d, :-1, k]], dim=1)
            terms.append(lab)
        a = torch.logsumexp(torch.stack(terms), dim=0)
        if 0 in durations:
            k0 = durations.index(0)
            alphas.append(_row(a, label[:, t] + duration[:, t, :-1, k0]))
        else:
            alphas.append(a)
    alpha = torch.stack(alphas, dim=1)  # (B, T', U+1)
    idx = torch.arange(b, device=blank.device)
    ends = []
    for k, d in enumerate(durations):
        if d < 1:
            continue
        t = frame_lens - d
        ok = t >= 0
        tc = t.clamp(min=0)
        v = alpha[idx, tc, target_lens] + blank[idx, tc, target_lens] + duration[idx, tc, target_lens, k]
        ends.append(torch.where(ok, v, torch.full_like(v, NEG_INF)))
    return torch.logsumexp(torch.stack(ends), dim=0)


class TransducerNLL(torch.autograd.Function):
    """Per-sample negative log-likelihood (B,), float32; gradients w.r.t. blank / label /
    duration log-probabilities."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        blank: torch.Tensor,
        label: torch.Tensor,
        duration: torch.Tensor | None,
        durations: tuple[int, ...],
        frame_lens: torch.Tensor,
        target_lens: torch.Tensor,
    ) -> torch.Tensor:
        ctx.durations = durations
        ctx.has_duration = duration is not None
        ctx.fake = is_fake(blank)
        ins = (blank, label) + ((duration,) if duration is not None else ())
        ctx.save_for_backward(*ins, frame_lens, target_lens)
        if ctx.fake:
            return blank.new_empty(blank.shape[0], dtype=torch.float32)
        with torch.enable_grad():
            return -_log_likelihood(*[x.detach() for x in ins], durations, frame_lens, target_lens).float()

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        *ins, frame_lens, target_lens = ctx.saved_tensors
        if ctx.fake:
            grads = [torch.empty_like(x) for x in ins]
        else:
            leaves = [x.detach().requires_grad_(True) for x in ins]
            with torch.enable_grad():
                nll = -_log_likelihood(*leaves, ctx.durations, frame_lens, target_lens)
                grads = list(torch.autograd.grad(nll, leaves, grad_out.double()))
            grads = [g.to(x.dtype) for g, x in zip(grads, ins)]
        if not ctx.has_duration:
            grads.append(None)
        return (*grads, None, None, None)


def _log_likelihood(*args: Any) -> torch.Tensor:
    if len(args) == 5:
        blank, label, durations, frame_lens, target_lens = args
        return rnnt_log_likelihood(blank, label, frame_lens, target_lens)
    blank, label, duration, durations, frame_lens, target_lens = args
    return tdt_log_likelihood(blank, label, duration, durations, frame_lens, target_lens)
