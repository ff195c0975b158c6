"""RoBERTa (and XLM-RoBERTa, CamemBERT), DistilBERT, ELECTRA, DeBERTa-v2/v3 and ModernBERT against
`transformers`, on tiny random models: logits and hidden states under head masks, export that
`transformers` loads, compact == masked, fused == members, circuit search == its definition,
bf16, and HIS against a PyTorch per-example reference."""

from __future__ import annotations

import dataclasses
import operator

import jax
import numpy as np
import pytest

import hydra_jax as hj
from hydra_jax import testing

torch = pytest.importorskip("torch", reason="torch is not installed: PyTorch parity skipped")
transformers = pytest.importorskip("transformers")

from equivalences import naive_circuit  # noqa: E402
from hf_reference import (  # noqa: E402
    assert_outputs_close,
    head_importance,
    masked_heads,
    to_numpy,
)

from hydra_jax.data import TokenizedSet, uncertainty_batches  # noqa: E402
from hydra_jax.heads import circuit_search  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]  # many compiled programs

L, N, K, F, V, T = 2, 3, 5, 22, 40, 7  # distinct: a swapped axis fails
PAD = 1  # RoBERTa's padding id (its positions start after it)
POSITIONS = 20  # RoBERTa: 18 tokens after the padding id, more than a padded batch's 16


@dataclasses.dataclass(frozen=True)
class Family:
    config: type
    classifier: type
    fields: dict
    base: str  # the attribute holding the backbone
    out_projection: str  # each layer's attention output projection, from the backbone

    def projections(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        layers, projection = self.out_projection.split(":")
        backbone = getattr(model, self.base)
        return [operator.attrgetter(projection)(l) for l in operator.attrgetter(layers)(backbone)]


BERT_LIKE = dict(vocab_size=V, hidden_size=N * K, num_hidden_layers=L, num_attention_heads=N,
                 intermediate_size=F, attn_implementation="eager")  # fmt: skip
FAMILIES = {
    "roberta": Family(
        transformers.RobertaConfig, transformers.RobertaForSequenceClassification,
        dict(BERT_LIKE, max_position_embeddings=POSITIONS, type_vocab_size=1, pad_token_id=PAD),
        "roberta", "encoder.layer:attention.output.dense",
    ),
    "distilbert": Family(
        transformers.DistilBertConfig, transformers.DistilBertForSequenceClassification,
        dict(vocab_size=V, dim=N * K, n_layers=L, n_heads=N, hidden_dim=F,
             max_position_embeddings=POSITIONS, attn_implementation="eager"),
        "distilbert", "transformer.layer:attention.out_lin",
    ),
    "electra": Family(
        transformers.ElectraConfig, transformers.ElectraForSequenceClassification,
        dict(BERT_LIKE, embedding_size=11, max_position_embeddings=POSITIONS, type_vocab_size=2),
        "electra", "encoder.layer:attention.output.dense",
    ),
    # DeBERTa-v3's settings: shared keys, normalised distance embeddings, no absolute positions,
    # no token types; 4 log buckets, fewer than a batch's T = 7 tokens.
    "deberta-v3": Family(
        transformers.DebertaV2Config, transformers.DebertaV2ForSequenceClassification,
        dict(BERT_LIKE, max_position_embeddings=POSITIONS, relative_attention=True,
             position_buckets=4, max_relative_positions=POSITIONS, pos_att_type="p2c|c2p",
             norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False,
             type_vocab_size=0),
        "deberta", "encoder.layer:attention.output.dense",
    ),
    # ModernBERT-base's settings (no biases, mean pooling, global then local layers) with a
    # local window of 2 either side, shorter than a batch's 7 tokens; heads of even width 6.
    "modernbert": Family(
        transformers.ModernBertConfig, transformers.ModernBertForSequenceClassification,
        dict(vocab_size=V, hidden_size=N * 6, num_hidden_layers=L, num_attention_heads=N,
             intermediate_size=F, max_position_embeddings=POSITIONS, local_attention=4,
             global_attn_every_n_layers=2, classifier_pooling="mean", pad_token_id=0,
             bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
             attn_implementation="eager"),
        "model", "layers:attn.Wo",
    ),
}  # fmt: skip
# DeBERTa-v2's other settings: separate position projections, exact distances clipped at 3 (a
# span shorter than the batch), absolute positions, token types, a projected embedding table,
# content-to-position terms only.
DEBERTA_V2 = dict(FAMILIES["deberta-v3"].fields, share_att_key=False, position_buckets=-1,
                  max_relative_positions=3, position_biased_input=True, type_vocab_size=2,
                  embedding_size=11, norm_rel_ebd="none", pos_att_type="c2p")  # fmt: skip


def batch(family: str, tokens: int = T) -> dict[str, np.ndarray]:
    """3 examples of `tokens` tokens, two of them padded (with the family's padding id)."""
    rng = np.random.default_rng(len(family))
    ids = rng.integers(3, V, (3, tokens))
    mask = (np.arange(tokens)[None] < np.array([tokens, tokens - 2, 3])[:, None]).astype(np.int64)
    pad = PAD if "roberta" in family else 0
    inputs = dict(input_ids=np.where(mask == 1, ids, pad), attention_mask=mask)
    if family == "deberta-v3":  # no token types: the second text's 1s are ignored, as in HF
        inputs["token_type_ids"] = (np.arange(tokens)[None] >= 3).astype(np.int64) * mask
    return inputs


def head_masks() -> list[np.ndarray | None]:
    rng = np.random.default_rng(7)
    binary = (rng.random((L, N)) > 0.4).astype(np.float32)
    binary[0] = 0.0  # a layer that loses every head
    binary[-1, 0] = 1.0
    return [None, binary, rng.uniform(0.0, 1.5, (L, N)).astype(np.float32)]


@pytest.mark.parametrize(
    ("config", "classifier"),
    [
        (transformers.XLMRobertaConfig, transformers.XLMRobertaForSequenceClassification),
        (transformers.CamembertConfig, transformers.CamembertForSequenceClassification),
    ],
)
def test_roberta_networks_under_other_names_load_and_export_as_themselves(
    config, classifier, tmp_path
):
    torch.manual_seed(3)
    fields = FAMILIES["roberta"].fields
    reference = classifier(config(**fields, num_labels=2)).eval()
    reference.save_pretrained(tmp_path / "hf")
    ours = hj.from_pretrained(tmp_path / "hf")
    assert ours.config.model_type == config.model_type
    inputs = batch("roberta")
    with torch.no_grad():
        expected = reference(**{k: torch.tensor(v) for k, v in inputs.items()}).logits
    testing.assert_close(ours(**inputs).logits, to_numpy(expected))
    hj.save_pretrained(ours, tmp_path / "ours")
    assert type(transformers.AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "ours")) is classifier  # fmt: skip


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request, tmp_path_factory):
    """(family name, the PyTorch classifier, ours loaded from its saved directory)."""
    name, family = request.param, FAMILIES[request.param]
    torch.manual_seed(len(name))
    reference = family.classifier(family.config(**family.fields, num_labels=4)).eval()
    path = tmp_path_factory.mktemp(name)
    reference.save_pretrained(path)
    return name, reference, hj.from_pretrained(path)


def test_logits_and_hidden_states_equal_transformers_under_head_masks(pair):
    name, reference, ours = pair
    inputs = batch(name)
    family = FAMILIES[name]
    for mask in head_masks():
        with masked_heads(family.projections(reference), mask), torch.no_grad():
            tensors = {k: torch.tensor(v) for k, v in inputs.items()}
            expected = reference(**tensors, output_attentions=True)
            hidden = getattr(reference, family.base)(**tensors).last_hidden_state
        out = ours(**inputs, head_mask=mask, output_attentions=True)
        assert_outputs_close(out, expected, hidden, name)


def test_export_loads_in_transformers_with_equal_logits(pair, tmp_path):
    name, _, ours = pair
    hj.save_pretrained(ours, tmp_path)
    reloaded = FAMILIES[name].classifier.from_pretrained(tmp_path).eval()
    inputs = batch(name)
    with torch.no_grad():
        expected = reloaded(**{k: torch.tensor(v) for k, v in inputs.items()}).logits
    testing.assert_close(ours(**inputs).logits, to_numpy(expected), err_msg=name)
    assert hj.from_pretrained(tmp_path).config == ours.config


def test_compact_equals_masked_and_fused_equals_members(pair):
    name, _, ours = pair
    inputs = batch(name)
    keep = np.array([[True, False, True], [False, True, True]])
    testing.assert_close(hj.heads.compact(ours, keep)(**inputs).logits,
                         ours(**inputs, head_mask=keep.astype(np.float32)).logits)  # fmt: skip
    sets = np.array([[[1, 0, 0], [0, 1, 0]], [[0, 1, 0], [0, 0, 1]], [[0, 0, 1], [1, 0, 0]]], bool)
    members = hj.hydra.members_from(ours, sets)
    fused = hj.hydra.fuse(members)
    logits = fused(**inputs).logits  # [B, M, C]
    averaged = hj.hydra.with_shared_weights(members)  # the members as fusion sees them
    for m, member in enumerate(averaged):
        testing.assert_close(logits[:, m], member(**inputs).logits, err_msg=f"{name} member {m}")


def test_his_equals_a_pytorch_per_example_reference(pair):
    """HIS = mean over examples of |d loss / d head mask| at mask 1, the mask applied to each
    head's context (a pre-hook on the output projection), the loss the example's cross-entropy."""
    name, reference, ours = pair
    inputs = batch(name)
    labels = np.array([0, 3, 1])
    his, _ = hj.heads.his_and_entropy(ours, [dict(inputs, labels=labels)])
    projections = FAMILIES[name].projections(reference)
    expected = head_importance(reference, projections, inputs, labels, (L, N))
    np.testing.assert_allclose(his, expected, rtol=0, atol=1e-4 * np.abs(expected).max())


def test_a_new_classifier_replaces_the_family_head(pair):
    name, _, ours = pair
    fresh = hj.with_classifier(ours, 5, jax.random.key(0))
    assert fresh.config.num_labels == 5
    assert fresh(**batch(name)).logits.shape == (3, 5)


def test_circuit_search_equals_the_naive_reference(pair):
    name, _, ours = pair
    rng = np.random.default_rng(5)
    pad = PAD if "roberta" in name else 0

    def tokens(n: int, low: int, high: int) -> list[np.ndarray]:
        return [rng.integers(low, high, rng.integers(2, T)).astype(np.int32) for _ in range(n)]

    id_set = TokenizedSet(tokens(8, 3, 20), rng.integers(0, 4, 8), pad)
    ood_set = TokenizedSet(tokens(6, 20, V), np.zeros(6, np.int64), pad)
    data = uncertainty_batches(id_set, ood_set, batch_size=8)
    keep = circuit_search(ours, data, keep_per_layer=2, objective="avg")
    np.testing.assert_array_equal(keep, naive_circuit(ours, data, 2, "avg"))


def test_bf16_compute_and_our_own_format(pair, tmp_path):
    name, _, ours = pair
    inputs = batch(name)
    full = np.asarray(ours(**inputs).logits)
    low = np.asarray(hj.with_dtype(ours, "bfloat16")(**inputs).logits)
    error = np.abs(low - full).max() / np.abs(full).max()
    assert 0 < error <= 0.05, error  # bf16 ran, and stayed within a few bf16 roundings
    hj.save_model(ours, tmp_path / name)
    restored = hj.load_model(tmp_path / name)
    assert restored.config == ours.config
    np.testing.assert_array_equal(restored(**inputs).logits, ours(**inputs).logits)


def variant_equals_transformers(
    family: str, fields: dict, inputs: dict, mask: np.ndarray, tmp_path, seed: int
) -> hj.Model:
    """A `family` classifier with other `fields` against `transformers` under `mask` (logits,
    hidden states, attentions), and its export loading there with equal logits; returns ours."""
    torch.manual_seed(seed)
    spec = FAMILIES[family]
    reference = spec.classifier(spec.config(**fields, num_labels=3)).eval()
    reference.save_pretrained(tmp_path / "hf")
    ours = hj.from_pretrained(tmp_path / "hf")
    tensors = {k: torch.tensor(v) for k, v in inputs.items()}
    with masked_heads(spec.projections(reference), mask), torch.no_grad():
        expected = reference(**tensors, output_attentions=True)
        hidden = getattr(reference, spec.base)(**tensors).last_hidden_state
    out = ours(**inputs, head_mask=mask, output_attentions=True)
    assert_outputs_close(out, expected, hidden, f"{family} variant")
    hj.save_pretrained(ours, tmp_path / "ours")
    with torch.no_grad():
        logits = spec.classifier.from_pretrained(tmp_path / "ours").eval()(**tensors).logits
    testing.assert_close(ours(**inputs).logits, to_numpy(logits))
    return ours


def test_deberta_v2_settings_equal_transformers_and_export(tmp_path):
    inputs = dict(batch("deberta-v2"), token_type_ids=np.tile(np.arange(T) % 2, (3, 1)))
    ours = variant_equals_transformers("deberta-v3", DEBERTA_V2, inputs, head_masks()[1],
                                       tmp_path, seed=11)  # fmt: skip
    attention = ours.params["encoder"]["layer_0"]["attention"]
    assert attention["pos_key"]["kernel"].shape == (N * K, N, K)  # its own position projection
    keep = np.array([[True, False, True], [False, True, True]])
    testing.assert_close(hj.heads.compact(ours, keep)(**inputs).logits,
                         ours(**inputs, head_mask=keep.astype(np.float32)).logits)  # fmt: skip


def test_modernbert_with_biases_and_cls_pooling_equals_transformers_and_exports(tmp_path):
    fields = dict(FAMILIES["modernbert"].fields, classifier_pooling="cls", norm_bias=True,
                  attention_bias=True, mlp_bias=True, classifier_bias=True, local_attention=6,
                  global_attn_every_n_layers=3, global_rope_theta=500.0)  # fmt: skip
    ours = variant_equals_transformers("modernbert", fields, batch("modernbert"),
                                       head_masks()[2], tmp_path, seed=13)  # fmt: skip
    assert ours.config.encoder.windows == (0, 3) and ours.config.encoder.rotary[0] == 500.0


# A sequence longer than the attention's query block (256 rows, attended block by block): the
# padding bias, DeBERTa's position terms and ModernBERT's windows are cut into the same rows.
@pytest.mark.parametrize("family", ["roberta", "deberta-v3", "modernbert"])
def test_sequences_longer_than_a_query_block_equal_transformers(family, tmp_path):
    from hydra_jax.models.attention import QUERY_BLOCK

    T_long = QUERY_BLOCK + 45
    fields = dict(FAMILIES[family].fields, max_position_embeddings=T_long + 2)
    variant_equals_transformers(family, fields, batch(family, T_long), head_masks()[2], tmp_path,
                                seed=17)  # fmt: skip


@pytest.mark.parametrize(("buckets", "max_distance"), [(256, 512), (4, POSITIONS), (6, 7)])
def test_deberta_log_buckets_equal_transformers(buckets, max_distance):
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    from hydra_jax.models.attention import log_buckets

    distance = np.arange(-1100, 1101)[None]
    expected = make_log_bucket_position(torch.tensor(distance), buckets, max_distance)
    np.testing.assert_array_equal(log_buckets(distance, buckets, max_distance),
                                  to_numpy(expected).astype(np.int64))  # fmt: skip


def test_a_model_without_token_types_takes_only_zeros():
    config = hj.models.BertConfig(
        testing.encoder(layers=L, heads=N, head_dim=K, mlp_dim=F),
        vocab_size=V, max_positions=POSITIONS, type_vocab_size=0, pooler=False, num_labels=2,
        model_type="distilbert",
    )  # fmt: skip
    ours = hj.Model.init(config, jax.random.key(0))
    inputs = batch("distilbert")
    zeros = ours(**inputs, token_type_ids=np.zeros_like(inputs["input_ids"])).logits
    testing.assert_close(zeros, ours(**inputs).logits)
    with pytest.raises(ValueError, match=r"token_type_ids must lie in \[0, 1\) \(this model has"):
        ours(**inputs, token_type_ids=np.ones_like(inputs["input_ids"]))
