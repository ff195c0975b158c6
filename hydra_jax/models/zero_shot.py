"""Zero-shot classifiers from dual encoders (CLIP, or a ViT-BERT `VisionTextDualEncoderModel`).

`zero_shot(model, class_names, templates, tokenizer)` returns the model's vision tower as a
classifier `Model` whose logits are `exp(logit_scale) * cos(image embedding, class c's prompt
ensemble)`: CLIP's recipe, each class's text embedding the normalised mean of its normalised
prompt embeddings. The text side runs once, here; scoring, pruning, circuit search and fusion
then treat the tower as any classifier.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from hydra_jax.models.architectures import architecture, input_names
from hydra_jax.models.model import Model, vision_tower
from hydra_jax.models.vit import normalise

# (texts) -> a padded batch: `input_ids` [B, T], `attention_mask` [B, T] (and, for BERT text
# towers, optionally `token_type_ids`), e.g. `lambda t: hf_tokenizer(t, padding=True,
# return_tensors="np")` or `hydra_jax.data.TextEncoder(...).pad`.
Tokenizer = Callable[[list[str]], Mapping[str, Any]]


def prompts(class_names: Sequence[str], templates: Sequence[str]) -> list[str]:
    """`template.format(name)` for every class (outer) and template (inner): `C * P` texts.

    Raises:
      ValueError: no class name or no template, one string where a list of them is meant, a
        class name twice (two classes no image could tell apart), or a template without `{}`.
    """
    for name, given in (("class_names", class_names), ("templates", templates)):
        if isinstance(given, str):  # its characters would be read as names or templates
            raise ValueError(f"{name} must be a list of strings, got the one string {given!r}")
    if not class_names or not templates:
        raise ValueError("zero-shot classification needs at least one class name and template")
    repeated = sorted(n for n, times in Counter(class_names).items() if times > 1)
    if repeated:
        raise ValueError(f"class names must be distinct; {repeated} appear more than once")
    bad = [t for t in templates if "{}" not in t]
    if bad:
        raise ValueError(f"templates must contain '{{}}' for the class name: {bad}")
    return [t.format(name) for name in class_names for t in templates]


def prompt_embeddings(
    model: Model,
    class_names: Sequence[str],
    templates: Sequence[str],
    tokenizer: Tokenizer,
    batch_size: int = 64,
) -> np.ndarray:
    """Class embeddings `[C, E]`: per class, the normalised mean of its normalised prompt
    embeddings (`template.format(name)` for every template)."""
    texts = prompts(class_names, templates)
    text_inputs = set(input_names(model.config)) - {"pixel_values"}
    embeds = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(texts[start : start + batch_size])
        inputs = {k: np.asarray(v) for k, v in batch.items() if k in text_inputs}
        embeds.append(np.asarray(model.apply(model.params, **inputs).text_embeds))
    per_prompt = np.concatenate(embeds).reshape(len(class_names), len(templates), -1)
    return np.asarray(normalise(jnp.asarray(per_prompt).mean(1)))  # [C, E]


def zero_shot(
    model: Model,
    class_names: Sequence[str],
    templates: Sequence[str],
    tokenizer: Tokenizer,
    batch_size: int = 64,
) -> Model:
    """The vision tower of `model` (CLIP or dual encoder) as a `len(class_names)`-way zero-shot
    classifier over prompt-ensemble class embeddings, with the model's own logit scale."""
    if architecture(model.config).vision_tower is None:
        raise TypeError(
            f"zero_shot takes a CLIP model or a dual encoder, not {type(model.config).__name__}"
        )
    tower = vision_tower(model)
    class_embeds = prompt_embeddings(model, class_names, templates, tokenizer, batch_size)
    config = dataclasses.replace(tower.config, num_labels=len(class_names))
    head = {"class_embeds": jnp.asarray(class_embeds), "logit_scale": model.params["logit_scale"]}
    if "logit_bias" in model.params:  # SigLIP
        head["logit_bias"] = model.params["logit_bias"]
    return Model(config, {**tower.params, **head})
