"""Comparing two programs that compute one function, for tests of code built on hydra_jax.

Two differently compiled float32 programs (a fused Hydra and its members run alone, a compacted
model and the masked one, a sharded run and one device, our model and `transformers`') compute
the same function with different roundings. Neither is "the exact one": XLA fuses operations and
orders reductions per program, and vector width and FMA contraction differ between CPU kinds
(AVX2-only Zen 3, AVX-512 Zen 4 and Zen 5), so the same pair of programs can agree to 1e-7 on one
machine and to 1e-6 on another. Each float32 operation rounds at 2**-24 (6e-8) of its operands;
a few layers of matrix products, softmaxes and normalisations add and amplify that to about 1e-6
of the output's scale on the small, sharpened random models of our tests (the largest we have
seen: 1.1e-6 on a gradient summed over a batch, on a Zen 5 EPYC). `F32_RTOL` (1e-5) leaves ten
times that, and is still far below the error of a real bug: a wrong head, a swapped axis or a
missing bias moves outputs by 1e-2 or more.

The tolerance is relative to the output's *scale* (its largest magnitude), not to each element:
an element near zero is the difference of large intermediate terms and rounds like them.

Where a test claims exactness (a gradient against finite differences, one formula against
another), compare in float64 (`jax.enable_x64`) with a tolerance near float64's rounding instead.
Bit equality is only for one program run twice (a restored checkpoint, a resumed run).
"""

from __future__ import annotations

from typing import Any

import numpy as np

F32_RTOL = 1e-5


def assert_close(actual: Any, desired: Any, *, rtol: float = F32_RTOL, err_msg: str = "") -> None:
    """Elementwise `|actual - desired| <= rtol * max|desired|` (see the module docstring).

    Shapes must be equal (no broadcasting: a missing axis is a bug, not a match).
    """
    actual, desired = np.asarray(actual, np.float64), np.asarray(desired, np.float64)
    if actual.shape != desired.shape:
        raise AssertionError(f"{err_msg} shapes differ: {actual.shape} != {desired.shape}".strip())
    scale = float(np.abs(desired).max()) if desired.size else 0.0
    np.testing.assert_allclose(actual, desired, rtol=0, atol=rtol * scale, err_msg=err_msg)
