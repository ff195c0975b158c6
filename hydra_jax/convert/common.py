"""Shared converter machinery: safe readers, config allow-lists, name tables, strict fill."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
from flax import traverse_util
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from hydra_jax.convert.torch_pickle import load_torch_bin
from hydra_jax.models import EncoderConfig, Model
from hydra_jax.models.encoder import ACTIVATIONS

# The HF config fields of a layer stack that BERT, DeBERTa, ViT and DINOv2 spell alike.
ENCODER_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "layer_norm_eps",
)
# ... and those of a CLIP or SigLIP tower.
TOWER_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "hidden_act",
    "layer_norm_eps",
    "attention_dropout",
)

logger = logging.getLogger(__name__)

# Fields every `PretrainedConfig` may write that do not change the network's function.
GENERIC_IGNORED = frozenset(
    {
        "_name_or_path",
        "architectures",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "model_type",
        "id2label",
        "label2id",
        "problem_type",
        "initializer_range",
        "initializer_factor",
        "use_cache",
        "gradient_checkpointing",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "tie_word_embeddings",
        "output_hidden_states",
        "output_attentions",
        "return_dict",
        "torchscript",
        "chunk_size_feed_forward",
        "pruned_heads",
        "finetuning_task",
        "tokenizer_class",
        "prefix",
        "task_specific_params",
        "use_return_dict",
        "tf_legacy_loss",
        "use_bfloat16",
        "_attn_implementation_autoset",
        "cross_attention_hidden_size",
        "encoder_no_repeat_ngram_size",
        # Generation settings that old configs carry for every model; they are unused by encoders.
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "output_scores",
        "return_dict_in_generate",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
    }
)


# Fields that are harmless only when false (a decoder or cross-attention is not an encoder).
MUST_BE_FALSE = frozenset({"is_decoder", "add_cross_attention", "is_encoder_decoder"})


class ConversionError(ValueError):
    """A checkpoint that does not match what the converter knows, named precisely."""


def load_config(path: Path) -> dict[str, Any]:
    """`path/config.json` as a dict; any problem names the file."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ConversionError(f"{path} has no config.json: not a HuggingFace model directory")
    try:
        hf = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConversionError(f"{config_file} is not valid JSON: {error}") from None
    if not isinstance(hf, dict):
        raise ConversionError(f"{config_file} holds a JSON {type(hf).__name__}, not an object")
    return hf


_MISSING = object()


def field(hf: Mapping[str, Any], name: str, kind: type | tuple[type, ...], default: Any = _MISSING):
    """`hf[name]`, checked to be of `kind` (bool is not an int); `default` when absent.

    Raises:
      ConversionError: a required field is missing, or a field has the wrong type.
    """
    if name not in hf or (hf[name] is None and default is not _MISSING):
        if default is _MISSING:
            raise ConversionError(f"config lacks the required field {name!r}")
        return default
    value = hf[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds:
        kinds = (*kinds, int)  # JSON writes 1e-12 as a float but 1 as an int
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        wanted = " or ".join(k.__name__ for k in kinds)
        raise ConversionError(
            f"config field {name!r} is {value!r} ({type(value).__name__}), expected {wanted}"
        )
    return value


def check_fields(hf: Mapping[str, Any], handled: Iterable[str], where: str) -> None:
    """Raises ConversionError naming any HF config field that is neither handled nor ignored."""
    for field in MUST_BE_FALSE & set(hf):
        if hf[field]:
            raise ConversionError(f"{where} config sets {field}={hf[field]!r}: not supported")
    known = set(handled) | GENERIC_IGNORED | MUST_BE_FALSE
    unknown = sorted(set(hf) - known)
    if unknown:
        raise ConversionError(
            f"unhandled {where} config field(s) {unknown}: this converter does not know whether "
            "they change the network, so it refuses to guess"
        )


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConversionError(message)


def read_state_dict(path: Path) -> dict[str, np.ndarray]:
    """The tensors of `model.safetensors`, or of a legacy `pytorch_model.bin` (read safely)."""
    if (path / "model.safetensors").is_file():
        try:
            return load_file(path / "model.safetensors")
        except (SafetensorError, OSError, ValueError) as error:
            raise ConversionError(
                f"{path / 'model.safetensors'} is not a readable safetensors file "
                f"(truncated or corrupt?): {error}"
            ) from None
    if (path / "pytorch_model.bin").is_file():
        return load_torch_bin(path / "pytorch_model.bin")
    raise ConversionError(f"{path} has neither model.safetensors nor pytorch_model.bin")


_CONVERTIBLE = (np.float16, np.float64, ml_dtypes.bfloat16)


def _checked_floats(name: str, src: np.ndarray, dtype: np.dtype, converted: Counter) -> np.ndarray:
    """`src` as `dtype`, refusing what a cast would silently corrupt (ints, bools, NaN/inf)."""
    src_dtype = np.dtype(src.dtype)
    if src_dtype != dtype:
        if not any(src_dtype == np.dtype(d) for d in _CONVERTIBLE):
            raise ConversionError(
                f"tensor {name!r} has dtype {src_dtype}, but the model expects floating-point "
                f"{dtype} (only float16, bfloat16 and float64 are converted)"
            )
        converted[str(src_dtype)] += 1
    out = np.asarray(src, dtype=dtype)
    if not np.all(np.isfinite(out)):
        bad = int(np.size(out) - np.isfinite(out).sum())
        raise ConversionError(f"tensor {name!r} has {bad} NaN/inf values")
    return out


@dataclasses.dataclass(frozen=True)
class Transform:
    """HF tensor <-> our leaf. `to_ours(x, target_shape)`; `to_hf(x)` inverts it."""

    to_ours: Callable[[np.ndarray, tuple[int, ...]], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]


IDENTITY = Transform(lambda x, shape: x, lambda x: x)
# torch Linear weight [out, in] <-> Flax Dense kernel [in, out].
LINEAR = Transform(lambda x, shape: x.T, lambda x: x.T)
# query/key/value weight [N*K, D] <-> kernel [D, N, K].
HEADS_IN = Transform(lambda x, shape: x.T.reshape(shape), lambda x: x.reshape(x.shape[0], -1).T)
# query/key/value bias [N*K] <-> [N, K].
HEADS_BIAS = Transform(lambda x, shape: x.reshape(shape), lambda x: x.reshape(-1))
# output weight [D, N*K] <-> kernel [N, K, D].
HEADS_OUT = Transform(lambda x, shape: x.T.reshape(shape), lambda x: x.reshape(-1, x.shape[-1]).T)
# Conv2d weight [D, C, P, P] <-> Flax Conv kernel [P, P, C, D].
CONV = Transform(lambda x, shape: x.transpose(2, 3, 1, 0), lambda x: x.transpose(3, 2, 0, 1))
# ViT's cls token [1, 1, D] and position embeddings [1, T, D] <-> [D] and [T, D].
SQUEEZE_1 = Transform(lambda x, shape: x.reshape(shape), lambda x: x[None])
SQUEEZE_2 = Transform(lambda x, shape: x.reshape(shape), lambda x: x[None, None])


@dataclasses.dataclass(frozen=True)
class Rule:
    """One row of a name-mapping table; `{l}` in both names stands for the layer index."""

    hf: str
    ours: str
    transform: Transform = IDENTITY


def dense(hf: str, ours: str, bias: bool = True) -> list[Rule]:
    rules = [Rule(f"{hf}.weight", f"{ours}/kernel", LINEAR)]
    return [*rules, Rule(f"{hf}.bias", f"{ours}/bias")] if bias else rules


def layer_norm(hf: str, ours: str) -> list[Rule]:
    return [Rule(f"{hf}.weight", f"{ours}/scale"), Rule(f"{hf}.bias", f"{ours}/bias")]


def attention(
    hf_qkv: tuple[str, str, str], hf_out: str, ours: str, qkv_bias: bool = True
) -> list[Rule]:
    """Rules for one attention block; `hf_qkv` are the HF query/key/value module names."""
    rules = []
    for hf, name in zip(hf_qkv, ("query", "key", "value"), strict=True):
        rules.append(Rule(f"{hf}.weight", f"{ours}/{name}/kernel", HEADS_IN))
        if qkv_bias:
            rules.append(Rule(f"{hf}.bias", f"{ours}/{name}/bias", HEADS_BIAS))
    return [
        *rules,
        Rule(f"{hf_out}.weight", f"{ours}/out/kernel", HEADS_OUT),
        Rule(f"{hf_out}.bias", f"{ours}/out/bias"),
    ]


def expand(rules: Iterable[Rule], num_layers: int) -> list[Rule]:
    """Repeats every rule containing `{l}` once per layer."""
    out = []
    for rule in rules:
        if "{l}" in rule.hf:
            out += [
                Rule(rule.hf.format(l=l), rule.ours.format(l=l), rule.transform)
                for l in range(num_layers)
            ]
        else:
            out.append(rule)
    return out


def strip_prefix(tensors: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """Removes an optional model prefix (`bert.`, `vit.`) from the keys that carry it."""
    return {k.removeprefix(prefix): v for k, v in tensors.items()}


def fill(
    rules: list[Rule],
    tensors: Mapping[str, np.ndarray],
    target: Any,
    ignored: Iterable[str] = (),
) -> dict[str, Any]:
    """Builds our parameter tree from HF tensors, strictly.

    Args:
      rules: the expanded name-mapping table.
      tensors: HF name -> array.
      target: the expected parameter tree (`jax.eval_shape` of the module's init).
      ignored: regular expressions of HF tensors known to carry nothing we model (buffers,
        pre-training heads).

    Raises:
      ConversionError: a missing, mis-shaped or unused source tensor, or an unfilled target leaf.
    """
    expected = {"/".join(k): v for k, v in traverse_util.flatten_dict(target).items()}
    filled: dict[str, np.ndarray] = {}
    converted: Counter = Counter()
    for rule in rules:
        if rule.hf not in tensors:
            raise ConversionError(f"checkpoint is missing tensor {rule.hf!r} (for {rule.ours})")
        if rule.ours not in expected:
            raise ConversionError(f"internal: rule target {rule.ours} is not a model parameter")
        leaf = expected[rule.ours]
        src = tensors[rule.hf]
        hf_shape = jax.eval_shape(rule.transform.to_hf, leaf).shape
        if tuple(src.shape) != tuple(hf_shape):
            raise ConversionError(
                f"tensor {rule.hf!r} has shape {tuple(src.shape)}, expected {tuple(hf_shape)} "
                f"from the config (for {rule.ours} of shape {tuple(leaf.shape)})"
            )
        checked = _checked_floats(rule.hf, np.asarray(src), np.dtype(leaf.dtype), converted)
        filled[rule.ours] = rule.transform.to_ours(checked, leaf.shape)
    used = {rule.hf for rule in rules}
    patterns = [re.compile(p) for p in ignored]
    unused = sorted(
        k for k in tensors if k not in used and not any(p.fullmatch(k) for p in patterns)
    )
    if unused:
        raise ConversionError(f"checkpoint has tensors this model does not use: {unused}")
    unfilled = sorted(set(expected) - set(filled))
    if unfilled:
        raise ConversionError(f"no checkpoint tensor fills parameters {unfilled}")
    if converted:
        counts = ", ".join(f"{n} {dtype}" for dtype, n in sorted(converted.items()))
        logger.warning("converted %s tensors to float32 parameters", counts)
    return traverse_util.unflatten_dict({tuple(k.split("/")): v for k, v in filled.items()})


def to_hf_tensors(rules: list[Rule], params: Any, prefix: str = "") -> dict[str, np.ndarray]:
    """Inverse of `fill`: our parameter tree -> HF name -> contiguous float array."""
    flat = {"/".join(k): v for k, v in traverse_util.flatten_dict(params).items()}
    out = {}
    for rule in rules:
        name = rule.hf if rule.hf.startswith("classifier.") else prefix + rule.hf
        array = np.asarray(rule.transform.to_hf(np.asarray(flat[rule.ours])))
        out[name] = np.array(array, order="C")  # (np.ascontiguousarray makes a scalar [1])
    return out


def write_hf(path: Path, hf_config: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True))
    save_file(dict(tensors), path / "model.safetensors", metadata={"format": "pt"})


def encoder_config(
    hf: Mapping[str, Any],
    where: str,
    *,
    pre_norm: bool,
    causal: bool = False,
    layer_norm_eps: float = 1e-12,
    dropout_fields: tuple[str, str] = ("hidden_dropout_prob", "attention_probs_dropout_prob"),
    dropout_default: float = 0.0,
    qkv_bias: bool = True,
) -> EncoderConfig:
    """The layer stack of an HF config (BERT, ViT and CLIP towers share these field names)."""
    act = field(hf, "hidden_act", str)
    require(act in ACTIVATIONS, f"{where} hidden_act={act!r} unsupported")
    D, N = field(hf, "hidden_size", int), field(hf, "num_attention_heads", int)
    L, F = field(hf, "num_hidden_layers", int), field(hf, "intermediate_size", int)
    require(min(D, N, L, F) > 0, f"{where} sizes must be positive: D={D}, N={N}, L={L}, F={F}")
    require(D % N == 0, f"{where} hidden_size {D} is not divisible by num_attention_heads {N}")
    residual, attention_ = dropout_fields
    return EncoderConfig(
        num_heads=(N,) * L,
        width=D,
        head_dim=D // N,
        mlp_dim=F,
        activation=act,
        layer_norm_eps=float(field(hf, "layer_norm_eps", float, layer_norm_eps)),
        pre_norm=pre_norm,
        causal=causal,
        qkv_bias=qkv_bias,
        dropout=float(field(hf, residual, float, dropout_default)),
        attention_dropout=float(field(hf, attention_, float, dropout_default)),
    )


def require_full_heads(e: EncoderConfig, family: str) -> None:
    """Raises ConversionError unless every layer has the same N heads with N * K == D (HF
    configs cannot say otherwise: export `heads.expand_to_full(model)` of a compacted model)."""
    require(
        len(set(e.num_heads)) == 1 and e.num_heads[0] * e.head_dim == e.width,
        f"HF {family} needs the same N heads in every layer with N*K == D; this model has "
        f"{list(e.num_heads)} heads of dim {e.head_dim} at width {e.width}",
    )


def encoder_hf_fields(e: EncoderConfig, family: str) -> dict[str, Any]:
    """Inverse of `encoder_config` for an exportable (unpruned) stack.

    Raises:
      ConversionError: layers with different head counts, or N * K != D (a compacted model:
        export `heads.expand_to_full(model)` instead).
    """
    require_full_heads(e, family)
    return {
        "hidden_size": e.width,
        "num_hidden_layers": e.num_layers,
        "num_attention_heads": e.num_heads[0],
        "intermediate_size": e.mlp_dim,
        "hidden_act": e.activation,
        "layer_norm_eps": e.layer_norm_eps,
    }


def num_labels(hf: Mapping[str, Any], classifier_suffix: str) -> int:
    """Classes of an HF `...For{classifier_suffix}` config (0 for a bare backbone)."""
    architectures = field(hf, "architectures", list, [])
    if not any(str(a).endswith(classifier_suffix) for a in architectures):
        return 0
    return len(field(hf, "id2label", dict, {0: 0, 1: 1}))


def label_fields(num_labels: int) -> dict[str, Any]:
    return {
        "id2label": {str(i): f"LABEL_{i}" for i in range(num_labels)},
        "label2id": {f"LABEL_{i}": i for i in range(num_labels)},
    }


def load_model(config: Any, rules: list[Rule], tensors: Mapping[str, Any], ignored=()) -> Model:
    """A `Model` of `config` whose every parameter is filled, strictly, from HF `tensors`,
    placed on the default device (as `Model.init` and `load_model` place theirs): host arrays
    would be copied to the device again at every call of a jitted function."""
    target = jax.eval_shape(lambda: Model.init(config, jax.random.key(0)).params)
    return Model(config, jax.device_put(fill(rules, tensors, target, ignored)))
