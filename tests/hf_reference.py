"""Reference outputs from `transformers` PyTorch models, with heads masked by forward pre-hooks.

transformers 5 has no `head_mask`; masking each head's context before the attention output
projection, as our models do, is done here with a pre-hook on that projection.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch


def vit_out_projections(backbone: torch.nn.Module) -> list[torch.nn.Module]:
    """Each layer's attention output projection of a ViT, DeiT or DINOv2 backbone, in either
    module layout of transformers 5: `layers[l].attention.o_proj` (ViT and DeiT from 5.9,
    DINOv2 from 5.20) or `encoder.layer[l].attention.output.dense` (before)."""
    layers = backbone.layers if hasattr(backbone, "layers") else backbone.encoder.layer
    return [
        l.attention.o_proj if hasattr(l.attention, "o_proj") else l.attention.output.dense
        for l in layers
    ]


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


def assert_outputs_close(ours, expected, hidden: torch.Tensor, what: str) -> None:
    """Our model's logits, last hidden state and attentions `[L, B, N, T, S]` against a
    `transformers` classifier's output (`output_attentions=True`) and its backbone's hidden
    state, to float32 rounding of each output's scale."""
    from hydra_jax import testing

    testing.assert_close(
        ours.logits, to_numpy(expected.logits), rtol=testing.PARITY_RTOL, err_msg=f"{what} logits"
    )
    testing.assert_close(
        ours.last_hidden_state, to_numpy(hidden), rtol=testing.PARITY_RTOL, err_msg=f"{what} hidden"
    )
    attentions = np.stack([to_numpy(a) for a in expected.attentions])
    testing.assert_close(
        ours.attentions, attentions, rtol=testing.PARITY_RTOL, err_msg=f"{what} attentions"
    )


def head_importance(
    model: torch.nn.Module,
    out_projections: Sequence[torch.nn.Module],
    inputs: dict[str, np.ndarray],
    labels: np.ndarray,
    shape: tuple[int, int],
) -> np.ndarray:
    """HIS by its definition in PyTorch: the mean over examples of `|d CE(x) / d m|` at m = 1,
    the head mask `m` `[L, N]` scaling each head's context (`masked_heads`), one example at a
    time."""
    mask = torch.ones(shape, requires_grad=True)
    grads = []
    for i in range(len(labels)):
        example = {k: torch.tensor(v[i : i + 1]) for k, v in inputs.items()}
        with masked_heads(out_projections, mask):
            logits = model(**example).logits
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(labels[i : i + 1]))
        grads.append(np.abs(to_numpy(torch.autograd.grad(loss, mask)[0])))
    return np.mean(grads, axis=0)
