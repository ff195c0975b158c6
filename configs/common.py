"""Settings shared by the study configs."""

from __future__ import annotations

import ml_collections


def pruning_curves(smoke: bool = False) -> ml_collections.ConfigDict:
    """The `pruning_curves` analysis's settings: criteria random (3 seeds), l2, his, ad, hies;
    0..70% of the heads removed; HIES alpha chosen per ratio from {0, 0.1, ..., 0.9}. `smoke`
    shrinks them to 3 ratios, 2 random seeds and 2 alphas."""
    settings = dict(
        ratios=tuple(round(0.1 * i, 1) for i in range(8)),
        criteria=("random", "l2", "his", "ad", "hies"),
        random_seeds=(0, 1, 2),
        alphas=tuple(round(0.1 * i, 1) for i in range(10)),
    )
    if smoke:
        settings.update(ratios=(0.0, 0.3, 0.6), random_seeds=(0, 1), alphas=(0.0, 0.5))
    return ml_collections.ConfigDict(settings)
