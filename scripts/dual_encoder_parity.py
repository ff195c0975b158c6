"""Our outputs against `transformers` on a published dual encoder, with real images and captions.

    python scripts/dual_encoder_parity.py runs/zero_shot_fmnist/hf/dual_encoder [--images 64]

Loads the directory with `hj.from_pretrained` and with `transformers`'
`VisionTextDualEncoderModel`, runs both on the first Fashion-MNIST test images and every
caption of the zero-shot config's templates, and prints the largest absolute difference of each
output (`image_embeds`, `text_embeds`, `logits_per_image`) and of the 10-way zero-shot logits.
Exits 1 if any exceeds 1e-5.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

import hydra_jax as hj
from hydra_jax import data
from hydra_jax.data import TextEncoder
from hydra_jax.experiments.study_data import CLASS_NAMES

sys.path.insert(0, str(Path(__file__).parent.parent))
from configs import zero_shot_fmnist


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path", type=Path)
    parser.add_argument("--images", type=int, default=64)
    args = parser.parse_args()
    templates = zero_shot_fmnist.get_config().zero_shot.templates
    classes = CLASS_NAMES["fashion_mnist"]
    images, _ = data.load_images("fashion_mnist", "test", data.default_data_dir())
    pixels = data.to_pixels(images[: args.images])
    encoder = TextEncoder(args.path, max_tokens=32)
    batch = encoder.pad(hj.models.prompts(classes, templates))
    ours = hj.from_pretrained(args.path)
    ref = transformers.VisionTextDualEncoderModel.from_pretrained(args.path).eval()
    with torch.no_grad():
        expected = ref(**{k: torch.tensor(v) for k, v in batch.items()},
                       pixel_values=torch.tensor(pixels))  # fmt: skip
    out = ours(**batch, pixel_values=pixels)
    worst = 0.0
    for name in ("image_embeds", "text_embeds", "logits_per_image"):
        diff = float(np.abs(np.asarray(getattr(out, name)) - getattr(expected, name).numpy()).max())
        worst = max(worst, diff)
        print(f"{name:<18} max |ours - transformers| = {diff:.2e}")
    classifier = hj.zero_shot(ours, classes, templates, encoder.pad)
    text = expected.text_embeds.numpy().reshape(len(classes), len(templates), -1).mean(1)
    text /= np.linalg.norm(text, axis=-1, keepdims=True)
    direct = np.exp(ref.logit_scale.item()) * expected.image_embeds.numpy() @ text.T
    diff = float(np.abs(np.asarray(classifier(pixel_values=pixels).logits) - direct).max())
    worst = max(worst, diff)
    print(f"{'zero-shot logits':<18} max |ours - transformers| = {diff:.2e}")
    return int(worst > 1e-5)


if __name__ == "__main__":
    sys.exit(main())
