"""Tokenisation with the checkpoint's own tokenizer, per-batch padding and length bucketing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tokenizers

PAD_MULTIPLE = 16  # pad T up to a multiple of this: few distinct shapes, so few XLA compiles


class TextEncoder:
    """The checkpoint's `tokenizer.json`, with its fixed padding switched off.

    all-MiniLM-L6-v2's tokenizer pads every sentence to 128; we pad per batch instead.
    """

    def __init__(self, checkpoint: Path, max_tokens: int = 64):
        self.tokenizer = tokenizers.Tokenizer.from_file(str(Path(checkpoint) / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_tokens)
        self.max_tokens = max_tokens
        pad = self.tokenizer.token_to_id("[PAD]")
        self.pad_id = 0 if pad is None else pad

    def __call__(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids (with [CLS] ... [SEP]) per text, at most `max_tokens` each."""
        return [np.array(e.ids, np.int32) for e in self.tokenizer.encode_batch(texts)]


def pad_batch(
    tokens: list[np.ndarray], pad_id: int, batch_size: int | None = None
) -> dict[str, np.ndarray]:
    """Pads token lists into `input_ids`, `attention_mask`, `token_type_ids` `[B, T]`.

    T is the longest sequence rounded up to `PAD_MULTIPLE`. With `batch_size`, the batch is
    filled up to that many rows by repeating the first sequence (callers keep `len(tokens)`
    rows of the output), so the last, short batch reuses the compiled program.

    Raises:
      ValueError: an empty batch or an empty sequence (nothing to attend to).
    """
    if not tokens:
        raise ValueError("empty batch: no sequences to pad")
    if any(t.size == 0 for t in tokens):
        raise ValueError("a sequence in the batch has no tokens (all padding)")
    rows = list(tokens) + [tokens[0]] * max(0, (batch_size or 0) - len(tokens))
    longest = max(t.size for t in rows)
    T = -(-longest // PAD_MULTIPLE) * PAD_MULTIPLE
    ids = np.full((len(rows), T), pad_id, np.int32)
    mask = np.zeros((len(rows), T), np.int32)
    for i, t in enumerate(rows):
        ids[i, : t.size] = t
        mask[i, : t.size] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def epoch_batches(
    lengths: np.ndarray, batch_size: int, seed: int, epoch: int, bucket_batches: int = 50
) -> list[np.ndarray]:
    """Shuffled, length-bucketed training batches for one epoch; a pure function of its inputs.

    The epoch's permutation is cut into buckets of `bucket_batches` batches; each bucket is
    sorted by length (so batches pad little) and cut into batches, whose order is shuffled
    again. The incomplete last batch is dropped. Resuming at step s needs only (seed, s).
    """
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    batches = []
    chunk = batch_size * bucket_batches
    for start in range(0, len(order), chunk):
        bucket = order[start : start + chunk]
        bucket = bucket[np.argsort(lengths[bucket], kind="stable")]
        batches += [bucket[i : i + batch_size] for i in range(0, len(bucket), batch_size)]
    batches = [b for b in batches if len(b) == batch_size]
    return [batches[i] for i in rng.permutation(len(batches))]


def eval_batches(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """All examples, sorted by length and cut into batches (the last may be short)."""
    order = np.argsort(lengths, kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
