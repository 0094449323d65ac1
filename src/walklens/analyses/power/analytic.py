"""The power method in closed form (seed 002): the iteration ``x <- x F / |x F|`` (or its residual form), the
alignment it predicts from the spectral gap, and the rate fitted to a measured alignment curve."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def power_iterate(F: torch.Tensor, x0: torch.Tensor, steps: int, residual: bool = False) -> torch.Tensor:
    """The power method in the row convention: ``x_{l+1} = x_l M / |x_l M| * |x_0|`` with M = F (or I + F when
    ``residual``), for rows ``x0`` [N, D]; returns [steps + 1, N, D] (index 0 is x0)."""
    M = F.double() + (torch.eye(F.shape[0], dtype=torch.float64) if residual else 0)
    x = x0.double()
    scale = x.norm(dim=-1, keepdim=True)
    out = [x]
    for _ in range(steps):
        y = x @ M
        x = y / y.norm(dim=-1, keepdim=True).clamp_min(1e-300) * scale
        out.append(x)
    return torch.stack(out)


def predicted_alignment(cos0: torch.Tensor, rho: float, steps: int) -> torch.Tensor:
    """Analytic power-method prediction: from |cos theta_0| per token and rate rho, the mean over tokens of
    |cos theta_l| with ``tan theta_l = tan theta_0 * rho^l``, for l = 0..steps ([steps + 1])."""
    c0 = cos0.double().clamp(1e-12, 1.0)
    tan0 = (1 - c0**2).clamp_min(0).sqrt() / c0
    l = torch.arange(steps + 1, dtype=torch.float64).view(-1, 1)
    tan_l = tan0.view(1, -1) * (rho**l)
    return (1 / (1 + tan_l**2).sqrt()).mean(1)


def fitted_rate(cos: Sequence[float] | torch.Tensor, start: int = 0, floor: float = 1e-6) -> float:
    """Rate rho fitted to an alignment curve: slope of log tan(theta_l) against l (least squares) from
    ``start``, using only points where tan theta >= ``floor`` (below it, tan from cos loses float64 precision)."""
    c = torch.as_tensor(cos, dtype=torch.float64).clamp(1e-12, 1.0)
    tan = (1 - c**2).clamp_min(0).sqrt() / c
    l = torch.arange(len(c), dtype=torch.float64)
    keep = (l >= start) & (tan > floor)
    if int(keep.sum()) < 2:
        return float("nan")
    x, y = l[keep], tan[keep].log()
    slope = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    return float(slope.exp())
