"""The Hydra paper's vision setting, planned, not run here: ViT-B/16 fine-tuned on ImageNet-1k
(224 px, 1,000 classes), its members keeping half the heads.

On real hardware the study would read TFDS `imagenet2012` (prepared: never downloaded
implicitly) and start from the HF checkpoint `google/vit-base-patch16-224`. Here `hydra-jax
plan` reads only the shapes below and compiles the methods' programs for a target, with
abstract weights (minutes on 2 CPU cores for a TPU topology):

    hydra-jax plan --config configs/paper/vit_b16_imagenet.py --target v5e:2x4 --json plan.json

Where the numbers come from: ViT-B/16's sizes are the checkpoint's (12 layers of 12 heads of 64,
MLP 3,072, LayerNorm epsilon 1e-12); the paper gives no batch size or member count, so
training uses batch 512, the standard ViT fine-tuning recipe (Dosovitskiy et al., 2021;
big_vision), prediction batch 256, and the Hydra 4 members of 6 heads per layer (half the
heads, as the paper's ViT members keep); bf16 compute, as on TPUs. The training step
rematerialises each layer (`plan.remat`, `hydra_jax.with_remat`): without it the Hydra's step at
batch 512 does not fit a v5e chip's 16 GB. `:rivals` adds BatchEnsemble and LoRA-Ensemble;
`:no_remat` plans single and Hydra without rematerialisation; `:smoke` plans them all on a
shrunk model and batches for a check in seconds (the test suite plans it for 8 CPU devices).
"""

from __future__ import annotations

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    if arg not in ("", "rivals", "smoke", "no_remat"):
        raise ValueError(f"unknown config variant {arg!r}; use '', 'rivals', 'smoke' or 'no_remat'")
    c = ml_collections.ConfigDict()
    c.title = "Hydra Ensembles: ViT-B/16 on ImageNet-1k (planned)"
    c.checkpoint = "google/vit-base-patch16-224"  # on real hardware; plan reads no weights
    c.data = ml_collections.ConfigDict(
        dict(train="tfds:imagenet2012:train", test="tfds:imagenet2012:validation")
    )
    c.architecture = ml_collections.ConfigDict(
        dict(
            family="vit", layers=12, heads=12, head_dim=64, mlp_dim=3072, image_size=224,
            patch_size=16, num_labels=1000, layer_norm_eps=1e-12,
        )
    )  # fmt: skip
    c.plan = ml_collections.ConfigDict(
        dict(
            methods="single,deep_ensemble,hydra",
            num_members=4, member_heads=6, predict_batch=256, train_batch=512, tokens=0,
            dtype="bfloat16", remat=True,
        )
    )  # fmt: skip
    if arg in ("rivals", "smoke"):  # the single-pass rivals too
        c.plan.methods += ",batch_ensemble,lora_ensemble"
    if arg == "no_remat":  # the training step without rematerialisation (docs/scale.md)
        c.plan.update(methods="single,hydra", remat=False)
    if arg == "smoke":
        c.title += " (smoke)"
        c.architecture.update(layers=1, heads=4, head_dim=16, mlp_dim=128, image_size=32,
                              patch_size=8, num_labels=10)  # fmt: skip
        c.plan.update(member_heads=2, predict_batch=64, train_batch=64, dtype="float32")
    c.lock()
    return c
