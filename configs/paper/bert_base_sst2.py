"""The Hydra paper's text setting, planned, not run here: BERT-base fine-tuned on SST-2
(128 tokens, 2 classes), its members keeping half the heads.

On real hardware the study would read TFDS `glue/sst2` (prepared: never downloaded implicitly)
and start from the HF checkpoint `bert-base-uncased`. `hydra-jax plan` reads only the shapes:

    hydra-jax plan --config configs/paper/bert_base_sst2.py --target v5e:2x4 --json plan.json

Where the numbers come from: BERT-base's sizes are the checkpoint's (12 layers of 12 heads of
64, MLP 3,072, vocabulary 30,522, 512 positions); batch 32 is the GLUE fine-tuning recipe of
Devlin et al. (2019), prediction batch 256, sequences of 128 tokens as the paper's; the Hydra
4 members of 6 heads per layer (half the heads); bf16 compute.
"""

from __future__ import annotations

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    if arg not in ("",):
        raise ValueError(f"unknown config variant {arg!r}; use ''")
    c = ml_collections.ConfigDict()
    c.title = "Hydra Ensembles: BERT-base on SST-2 (planned)"
    c.checkpoint = "bert-base-uncased"  # on real hardware; plan reads no weights
    c.data = ml_collections.ConfigDict(
        dict(train="tfds:glue/sst2:train", test="tfds:glue/sst2:validation")
    )
    c.architecture = ml_collections.ConfigDict(
        dict(
            family="bert", layers=12, heads=12, head_dim=64, mlp_dim=3072, vocab_size=30522,
            max_positions=512, num_labels=2,
        )
    )  # fmt: skip
    c.plan = ml_collections.ConfigDict(
        dict(
            methods="single,deep_ensemble,hydra",
            num_members=4, member_heads=6, predict_batch=256, train_batch=32, tokens=128,
            dtype="bfloat16", remat=False,
        )
    )  # fmt: skip
    c.lock()
    return c
