"""Input checks shared by every public entry point.

Every check raises ``ValueError`` naming the offending argument; nothing is silently
repaired except the documented renormalisation of half-precision inputs.

Tolerance on ``sum(x) == 1`` along the last dimension, by dtype (``SUM_TOLERANCE``):
float64 1e-6, float32 1e-4, float16 1e-2, bfloat16 2e-2. Inputs in float16/bfloat16 are
cast to float32 and divided by their sum; float32 and float64 inputs are used as given.
"""
from __future__ import annotations

import torch

SUM_TOLERANCE = {
    torch.float64: 1e-6,
    torch.float32: 1e-4,
    torch.float16: 1e-2,
    torch.bfloat16: 2e-2,
}


def as_probs(x, name: str, *, min_ndim: int = 1) -> torch.Tensor:
    """Validate a probability tensor ``x`` (``[..., V]``) and return it in float32 or float64."""
    if not isinstance(x, torch.Tensor):
        try:
            x = torch.as_tensor(x, dtype=torch.float64)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"{name} must be a tensor of probabilities, got {type(x).__name__}") from exc
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor of probabilities, got dtype {x.dtype}")
    if x.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s) [..., V], got shape {tuple(x.shape)}")
    if x.shape[-1] < 1:
        raise ValueError(f"{name} has an empty vocabulary dimension (V = 0)")
    if x.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(x.shape)})")
    tol = SUM_TOLERANCE.get(x.dtype, 1e-4)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    s = x.sum(-1, dtype=acc)
    if not bool(torch.isfinite(s).all()):
        raise ValueError(f"{name} contains NaN or inf")
    lo = x.amin()
    if bool(lo < 0):
        raise ValueError(f"{name} has negative entries (min {float(lo):.3g}); probabilities must be >= 0")
    dev = (s - 1).abs().max()
    if bool(dev > tol):
        worst = s.flatten()[(s - 1).abs().flatten().argmax()]
        raise ValueError(
            f"{name} must sum to 1 along its last dimension (tolerance {tol:g} for {x.dtype}); "
            f"a row sums to {float(worst):.6g}"
        )
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float() / s.unsqueeze(-1)
    elif x.dtype not in (torch.float32, torch.float64):
        x = x.double()
    return x


def as_probs64(x, name: str, *, min_ndim: int = 1) -> torch.Tensor:
    """``as_probs`` in float64 for the exact paths (certificates, alpha*, LPs): inputs that
    are not float64 are divided by their float64 sum, float64 inputs are used as given.
    The one normalisation rule every exact path applies (``DraftLaw._q64`` does the same for q)."""
    x = as_probs(x, name, min_ndim=min_ndim)
    if x.dtype == torch.float64:
        return x
    x = x.double()
    return x / x.sum(-1, keepdim=True)


def as_k(k, name: str = "k") -> int:
    if isinstance(k, bool) or not isinstance(k, int):
        try:
            if isinstance(k, torch.Tensor) and k.numel() == 1 and not k.is_floating_point():
                k = int(k)
            else:
                raise TypeError
        except TypeError:
            raise ValueError(f"{name} must be a positive integer, got {k!r}") from None
    if k < 1:
        raise ValueError(f"{name} must be >= 1 (number of drafts), got {k}")
    return int(k)


def as_tokens(drafts, name: str, V: int) -> torch.Tensor:
    """Validate integer token ids in ``[0, V)``; returns int64."""
    if not isinstance(drafts, torch.Tensor):
        try:
            drafts = torch.as_tensor(drafts)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"{name} must be a tensor of token ids") from exc
    if drafts.is_floating_point() or drafts.is_complex() or drafts.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer token ids, got dtype {drafts.dtype}")
    drafts = drafts.long()
    if drafts.numel() and bool(((drafts < 0) | (drafts >= V)).any()):
        bad = drafts[(drafts < 0) | (drafts >= V)].flatten()[0]
        raise ValueError(f"{name} holds token id {int(bad)} outside the vocabulary [0, {V})")
    return drafts


def as_generator(generator, device=None) -> torch.Generator:
    """An explicit ``torch.Generator`` or an integer seed; never the global RNG."""
    if isinstance(generator, torch.Generator):
        return generator
    if isinstance(generator, int) and not isinstance(generator, bool):
        g = torch.Generator(device=device or "cpu")
        g.manual_seed(generator)
        return g
    raise ValueError(
        "generator must be a torch.Generator or an integer seed "
        "(randomness is always explicit), got " + repr(type(generator).__name__)
    )
