"""Reference outputs from `transformers` PyTorch models, with heads masked by forward pre-hooks.

transformers 5 has no `head_mask`; masking each head's context before the attention output
projection, as our models do, is done here with a pre-hook on that projection.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch


@contextmanager
def masked_heads(
    out_projections: Sequence[torch.nn.Module], head_mask: np.ndarray | torch.Tensor | None
) -> Iterator[None]:
    """Multiplies head h of layer l's context by `head_mask[l, h]` inside the context (a
    tensor that requires gradients gets them: a PyTorch reference for head-mask gradients)."""
    handles = []
    if head_mask is not None:
        for projection, mask in zip(out_projections, head_mask, strict=True):
            m = mask if isinstance(mask, torch.Tensor) else torch.tensor(np.asarray(mask))
            m = m.to(torch.float32)  # a tensor keeps its graph: gradients reach the mask

            def hook(module: torch.nn.Module, args: tuple, m: torch.Tensor = m) -> tuple:
                (context,) = args  # [B, T, N*K]
                B, T, _ = context.shape
                per_head = context.view(B, T, m.shape[0], -1) * m[None, None, :, None]
                return (per_head.view(B, T, -1),)

            handles.append(projection.register_forward_pre_hook(hook))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def to_numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().numpy()
