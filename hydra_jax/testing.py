"""Comparing two programs that compute one function, for tests of code built on hydra_jax.

Two differently compiled float32 programs (a fused Hydra and its members run alone, a compacted
model and the masked one, a sharded run and one device, rows at different positions of one
batch, our model and `transformers`') compute the same function with different roundings.
Neither is "the exact one": XLA fuses operations and orders reductions per program, and the
matrix-product kernels differ between CPU kinds (the library XLA:CPU calls picks its kernels
from the CPU it finds, AVX2 on a Zen 3, AVX-512 or AMX elsewhere), so the same pair of programs
agrees more closely on one machine than on another. Each float32 operation rounds at 2**-24
(6e-8) of its operands; a few layers of matrix products, softmaxes and normalisations add and
amplify that, most on the sharpened random models (weights x5) that head-selection tests use.

The rule: `F32_RTOL` is four times the largest relative difference seen over the suite's
two-program comparisons on any CPU kind, rounded up. `assert_close` appends each comparison's
ratio of difference to tolerance to `$HYDRA_JAX_CLOSENESS_LOG` when that is set (`make
closeness` runs the suite so and prints the largest). The largest differences, as fractions of
the output's scale: 7.2e-6 on a 2-core Intel Xeon (AVX-512, AMX; BatchEnsemble and LoRA members
at neutral initialisation against the model); with XLA's generated code capped by
`--xla_cpu_max_isa` there, the same to the last digit at AVX2 and 6.1e-6 and 7.0e-6 at AVX and
SSE4.2 (the cap leaves the matrix-product library's kernels as they are, so it does not show
what a Zen 3 computes); and 1.06e-5 on an AMD EPYC Zen 3 (AVX2 only; a LoRA-Ensemble on a mesh).
Hence `F32_RTOL` = 5e-5, still far below the error of a real bug: a wrong head, a swapped axis
or a missing bias moves outputs by 1e-2 or more. Parity with `transformers` is held to 1e-5 of
the output's scale (`PARITY_RTOL`), the target the models were written to; the parity tests'
largest difference was 1.05e-6 of the output's scale on the Xeon, capped or not.

The tolerance is relative to the output's *scale* (its largest magnitude), not to each element:
an element near zero is the difference of large intermediate terms and rounds like them.

Where a test claims exactness (a gradient against finite differences, one formula against
another), compare in float64 (`jax.enable_x64`) with a tolerance near float64's rounding instead.
Bit equality is only for one program run twice on the same inputs (a restored checkpoint, a
resumed run, a draw from one seed).

Tiny models: `bert`, `vit`, `clip` and `dual_encoder` build configs of a few layers and a few
heads by keyword (every field of `EncoderConfig` or of the family's config may be given), and
`tiny` initialises one:

    model = tiny(bert(layers=3, heads=5, head_dim=3, num_labels=2))

Give each test module its own odd, distinct sizes (L != N != K != C): a swapped axis then
fails with a shape error instead of passing by coincidence.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np

from hydra_jax.models import (
    BertConfig,
    CLIPConfig,
    CLIPTextConfig,
    CLIPVisionConfig,
    DualEncoderConfig,
    EncoderConfig,
    Model,
    ViTConfig,
)
from hydra_jax.models.sharding import path_string

F32_RTOL = 5e-5  # four times the largest relative difference measured (module docstring)
PARITY_RTOL = 1e-5  # our models against transformers'
_ENCODER_FIELDS = frozenset(f.name for f in dataclasses.fields(EncoderConfig))
_SIZES = frozenset({"layers", "heads"})


def assert_close(actual: Any, desired: Any, *, rtol: float = F32_RTOL, err_msg: str = "") -> None:
    """Elementwise `|actual - desired| <= rtol * max|desired|` (see the module docstring).

    Shapes must be equal (no broadcasting: a missing axis is a bug, not a match).
    """
    actual, desired = np.asarray(actual, np.float64), np.asarray(desired, np.float64)
    if actual.shape != desired.shape:
        raise AssertionError(f"{err_msg} shapes differ: {actual.shape} != {desired.shape}".strip())
    scale = float(np.abs(desired).max()) if desired.size else 0.0
    _log_ratio(actual, desired, rtol * scale)
    np.testing.assert_allclose(actual, desired, rtol=0, atol=rtol * scale, err_msg=err_msg)


def _log_ratio(actual: np.ndarray, desired: np.ndarray, atol: float) -> None:
    """Appends `test id, largest |actual - desired| / atol` to `$HYDRA_JAX_CLOSENESS_LOG`."""
    path = os.environ.get("HYDRA_JAX_CLOSENESS_LOG")
    if not path or not actual.size:
        return
    worst = float(np.abs(actual - desired).max())
    ratio = worst / atol if atol else (0.0 if worst == 0 else float("inf"))
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
    with open(path, "a") as log:
        log.write(f"{test}\t{ratio:.4g}\n")


def encoder(
    *,
    layers: int = 2,
    heads: int | tuple[int, ...] = 4,
    head_dim: int = 4,
    mlp_dim: int = 10,
    activation: str = "gelu",
    layer_norm_eps: float = 1e-12,
    pre_norm: bool = False,
    **options: Any,
) -> EncoderConfig:
    """An `EncoderConfig` of `layers` layers of `heads` heads (a tuple: per layer), width N * K."""
    derived = sorted({"num_heads", "width"} & set(options))
    if derived:
        raise TypeError(f"{derived} follow from layers, heads and head_dim; give those instead")
    num_heads = tuple(heads) if isinstance(heads, tuple) else (heads,) * layers
    width = max(num_heads) * head_dim
    return EncoderConfig(
        num_heads, width, head_dim, mlp_dim, activation, layer_norm_eps, pre_norm, **options
    )


def _split(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`options` as (EncoderConfig fields, the family config's own fields)."""
    stack = {k: v for k, v in options.items() if k in _ENCODER_FIELDS or k in _SIZES}
    return stack, {k: v for k, v in options.items() if k not in stack}


def bert(
    *, vocab_size: int = 50, max_positions: int = 12, type_vocab_size: int = 2, **options: Any
) -> BertConfig:
    """A post-LN BERT (pooler on); `options` are `encoder`'s or `BertConfig`'s fields."""
    stack, own = _split(options)
    return BertConfig(encoder(**stack), vocab_size, max_positions, type_vocab_size, **own)


def vit(*, image_size: int = 8, patch_size: int = 4, **options: Any) -> ViTConfig:
    """A pre-LN ViT on `image_size`-pixel RGB images; `options` as in `bert`."""
    stack, own = _split(options)
    return ViTConfig(encoder(**{"pre_norm": True, **stack}), image_size, patch_size, **own)


def clip(
    *,
    text: dict[str, Any] | None = None,
    vision: dict[str, Any] | None = None,
    vocab_size: int = 30,
    max_positions: int = 8,
    image_size: int = 8,
    patch_size: int = 4,
    num_channels: int = 3,
    projection_dim: int = 6,
) -> CLIPConfig:
    """A CLIP of quick-GELU pre-LN towers (the text tower causal, its EOS the last id);
    `text` and `vision` are `encoder` options of each tower."""
    towers = {"activation": "quick_gelu", "layer_norm_eps": 1e-5, "pre_norm": True}
    return CLIPConfig(
        CLIPTextConfig(
            encoder(**{**towers, "causal": True, **(text or {})}),
            vocab_size,
            max_positions,
            vocab_size - 1,
        ),
        CLIPVisionConfig(
            encoder(**{**towers, **(vision or {})}), image_size, patch_size, num_channels
        ),
        projection_dim,
    )


def dual_encoder(
    *,
    vision: dict[str, Any] | None = None,
    text: dict[str, Any] | None = None,
    projection_dim: int = 6,
) -> DualEncoderConfig:
    """A ViT-BERT dual encoder; `vision` and `text` are options of `vit` and `bert`."""
    return DualEncoderConfig(vit(**(vision or {})), bert(**(text or {})), projection_dim)


def tiny(config: Any, seed: int = 0) -> Model:
    """`config`'s model, initialised from `jax.random.key(seed)`."""
    return Model.init(config, jax.random.key(seed))


def sharpened(model: Model, factor: float = 5.0) -> Model:
    """`model` with its matrices scaled by `factor`: larger weights than the 0.02 init, so that
    heads differ clearly (a head-selection test can then tell them apart)."""
    scaled = jax.tree.map(lambda x: x * factor if x.ndim > 1 else x, model.params)
    return Model(model.config, scaled)


def assert_trained_params_close(
    got: Any, want: Any, *, rtol: float = 0.0, atol: float = 1e-5
) -> None:
    """Trained weights equal within 1e-5 (absolute, by default; weights are at most about 1, and
    Adam's update divides each gradient by its own scale, so float32 rounding of the gradients
    moves a weight by about lr * 1e-6), attention key biases left out: their exact gradient is 0
    (softmax ignores a constant shift per query), so Adam scales rounding noise (~1e-9) up to
    steps of ~lr either way."""
    flat_got = jax.tree_util.tree_flatten_with_path(got)[0]
    flat_want = jax.tree_util.tree_flatten_with_path(want)[0]
    for (path, a), (other, b) in zip(flat_got, flat_want, strict=True):
        name = path_string(path)
        assert name == path_string(other), (name, path_string(other))
        if not name.endswith("key/bias"):
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=name)
