"""Text: tokenisation with the checkpoint's own tokenizer, per-batch padding, `TokenizedSet`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers

from hydra_jax import checks
from hydra_jax.data.dataset import Batch

# The least token cap: [CLS], a token, [SEP]. The tokenizer does not truncate below its special
# tokens: a cap of 0 or 1 kept every sentence whole, and 2 left [CLS] [SEP] alone.
MIN_TOKENS = 3
PAD_MULTIPLE = 16  # pad T up to a multiple of this: few distinct shapes, so few XLA compiles


def pad_id(tokenizer: tokenizers.Tokenizer, checkpoint: Path) -> int:
    """The padding id of a checkpoint's tokenizer: its own padding setting, else the
    `pad_token` of `tokenizer_config.json`, else `[PAD]` (BERT) or `<pad>` (RoBERTa, XLM-R),
    else 0. RoBERTa-family models count positions from it, so it must be the tokenizer's."""
    if tokenizer.padding is not None:
        return int(tokenizer.padding["pad_id"])
    config = checkpoint / "tokenizer_config.json"
    names = ["[PAD]", "<pad>"]
    if config.is_file():
        token = json.loads(config.read_text()).get("pad_token")
        token = token.get("content") if isinstance(token, dict) else token
        names = [token, *names] if isinstance(token, str) else names
    ids = [tokenizer.token_to_id(name) for name in names]
    return next((i for i in ids if i is not None), 0)


class TextEncoder:
    """The checkpoint's `tokenizer.json`, with its fixed padding switched off.

    all-MiniLM-L6-v2's tokenizer pads every sentence to 128; we pad per batch instead.
    """

    def __init__(self, checkpoint: Path, max_tokens: int = 64):
        checks.count("max_tokens ([CLS], a token, [SEP])", max_tokens, minimum=MIN_TOKENS)
        path = Path(checkpoint) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{checkpoint} has no tokenizer.json (a fast tokenizer); write one with "
                "transformers.AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR) (a "
                "SentencePiece-only checkpoint, such as DeBERTa-v3's spm.model, needs the "
                "sentencepiece package for that conversion)"
            )
        self.tokenizer = tokenizers.Tokenizer.from_file(str(path))
        self.pad_id = pad_id(self.tokenizer, Path(checkpoint))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_tokens)
        self.max_tokens = max_tokens

    def __call__(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids (with [CLS] ... [SEP]) per text, at most `max_tokens` each."""
        return [np.array(e.ids, np.int32) for e in self.tokenizer.encode_batch(texts)]

    def encode(
        self, texts: list[str], pairs: list[str] | None = None
    ) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
        """Token ids per text, and with `pairs` (sentence pairs: [CLS] a [SEP] b [SEP]) the
        token type ids (0 for the first text, 1 for the second; None without pairs)."""
        if pairs is None:
            return self(texts), None
        if len(pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(pairs)} second texts")
        encodings = self.tokenizer.encode_batch(list(zip(texts, pairs, strict=True)))
        return (
            [np.array(e.ids, np.int32) for e in encodings],
            [np.array(e.type_ids, np.int32) for e in encodings],
        )

    def pad(self, texts: list[str], length: int = 0, exact: bool = False) -> dict[str, np.ndarray]:
        """`texts` as one padded batch (`pad_batch`): a tokenizer for `hj.zero_shot`. With
        `exact`, rows are the longest text's length, or exactly `length` tokens (a text tower
        that reads a fixed position, as SigLIP's does, gets the padding it was trained with)."""
        return pad_batch(self(texts), self.pad_id, length=length, exact=exact)


def pad_batch(
    tokens: list[np.ndarray],
    pad_id: int,
    batch_size: int | None = None,
    length: int = 0,
    type_ids: list[np.ndarray] | None = None,
    exact: bool = False,
) -> dict[str, np.ndarray]:
    """Pads token lists into `input_ids`, `attention_mask`, `token_type_ids` `[B, T]`.

    T is the longest sequence (or `length`, if longer: the rows one process loads of a global
    batch pad as the whole batch does) rounded up to `PAD_MULTIPLE`. With `batch_size`, the batch is
    filled up to that many rows by repeating the first sequence (callers keep `len(tokens)`
    rows of the output), so the last, short batch reuses the compiled program. `type_ids`
    (sentence pairs) fill `token_type_ids` (zeros without them). With `exact`, T is not
    rounded: it is `length`, or the longest sequence when `length` is 0.

    Raises:
      ValueError: an empty batch or an empty sequence (nothing to attend to); with `exact`, a
        sequence longer than `length`.
    """
    if not tokens:
        raise ValueError("empty batch: no sequences to pad")
    if any(t.size == 0 for t in tokens):
        raise ValueError("a sequence in the batch has no tokens (all padding)")
    rows = list(tokens) + [tokens[0]] * max(0, (batch_size or 0) - len(tokens))
    longest = max(length, *(t.size for t in rows))
    if exact and length and longest > length:
        raise ValueError(f"a text has {longest} tokens, more than the {length} it is padded to")
    T = longest if exact else -(-longest // PAD_MULTIPLE) * PAD_MULTIPLE
    ids = np.full((len(rows), T), pad_id, np.int32)
    mask = np.zeros((len(rows), T), np.int32)
    types = np.zeros_like(ids)
    type_rows = (
        None if type_ids is None else list(type_ids) + [type_ids[0]] * (len(rows) - len(tokens))
    )
    for i, t in enumerate(rows):
        ids[i, : t.size] = t
        mask[i, : t.size] = 1
        if type_rows is not None:
            types[i, : t.size] = type_rows[i]
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


@dataclasses.dataclass(frozen=True)
class TokenizedSet:
    """Token id arrays (ragged) and integer labels `[N]`: the text `Dataset`; for sentence
    pairs, token type ids shaped as the token ids (`type_ids`; None: all 0)."""

    tokens: list[np.ndarray]
    labels: np.ndarray
    pad_id: int = 0
    type_ids: list[np.ndarray] | None = None

    def __post_init__(self) -> None:
        if np.ndim(self.labels) != 1 or len(self.labels) != len(self.tokens):
            raise ValueError(
                f"labels must be [N], one per token array; got {len(self.tokens)} token arrays "
                f"and labels of shape {np.shape(self.labels)}"
            )
        bad = [i for i, t in enumerate(self.tokens) if np.ndim(t) != 1 or np.size(t) == 0]
        if bad:
            raise ValueError(f"token arrays must be 1-D and non-empty; examples {bad[:5]} are not")
        if self.type_ids is not None and [np.shape(t) for t in self.type_ids] != [
            np.shape(t) for t in self.tokens
        ]:
            raise ValueError("type_ids must have one array per token array, of the same shape")

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def lengths(self) -> np.ndarray:
        return np.array([t.size for t in self.tokens])

    def take(self, index: np.ndarray) -> TokenizedSet:
        types = None if self.type_ids is None else [self.type_ids[i] for i in index]
        return TokenizedSet([self.tokens[i] for i in index], self.labels[index], self.pad_id, types)

    def concat(self, other: Any) -> TokenizedSet:
        if not isinstance(other, TokenizedSet) or other.pad_id != self.pad_id:
            raise TypeError("only token sets with the same pad id concatenate")
        types = None
        if self.type_ids is not None or other.type_ids is not None:
            types = [*_types_of(self), *_types_of(other)]
        labels = np.concatenate([self.labels, other.labels])
        return TokenizedSet(self.tokens + other.tokens, labels, self.pad_id, types)

    def batch(self, index: np.ndarray, batch_size: int | None = None, length: int = 0) -> Batch:
        types = None if self.type_ids is None else [self.type_ids[i] for i in index]
        batch = pad_batch([self.tokens[i] for i in index], self.pad_id, batch_size, length, types)
        labels = self.labels[index]
        if batch_size is not None:
            labels = np.concatenate([labels, np.repeat(labels[:1], batch_size - len(index))])
        return {**batch, "labels": labels}


def _types_of(data: TokenizedSet) -> list[np.ndarray]:
    return data.type_ids if data.type_ids is not None else [np.zeros_like(t) for t in data.tokens]


def random_tokens(rng: np.random.Generator, batch_size: int, tokens: int) -> Batch:
    """A full-length batch of random word-piece ids `[B, T]` (no padding): latency measurements."""
    ids = rng.integers(1000, 30000, (batch_size, tokens)).astype(np.int32)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": 0 * ids}
