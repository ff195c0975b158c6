"""Our jit-compiled forward vs the `transformers` PyTorch forward of the same checkpoint: the real
MiniLM-L6 (batch 32 x 64 tokens), or a random model of a real checkpoint's shape:
`--family deberta` DeBERTa-v3-small (768 wide, 6 layers of 12 heads, 256 position buckets, a
128,100-token vocabulary; batch 32 x 64 tokens), `--family modernbert` ModernBERT-base (768
wide, 22 layers of 12 heads, GeGLU 1152, local layers of 128 tokens between global ones; batch
32 x 64), `--family dinov2` DINOv2-S (384 wide, 12 layers of 6 heads, patch 14, positions for
518 px) on 224 px images (batch 8), its positions resized as a real DINOv2 checkpoint's are;
`--family siglip` a SigLIP-B/16 image classifier (`SiglipForImageClassification`: the vision
tower of google/siglip-base-patch16-224, 768 wide, 12 layers of 12 heads, 196 patches, and a
10-way classifier on the mean token; batch 8 x 224 px, the logits compared).

CPU, fp32, or `--dtype bfloat16`: ours through `hj.with_dtype` (bf16 dense products, fp32 hidden
states, softmax and LayerNorm statistics; `--dtype bfloat16:bfloat16`: bf16 hidden states too),
PyTorch under `torch.autocast("cpu", torch.bfloat16)` (bf16 matmuls, its own fp32 list). Each side
runs in its own process, the sides taking turns (bench/processes.py: PyTorch's spinning OpenMP
threads would slow an XLA program in the same process); prints medians, the ratio (target: ours <=
1.0x PyTorch), XLA's FLOP count, the achieved GFLOP/s and the largest difference between the two
outputs.

    .venv/bin/python -m bench.forward [--family minilm|deberta|modernbert|dinov2|siglip]
        [--rounds 4] [--repeats 10] [--dtype float32|bfloat16|bfloat16:bfloat16]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import jax
import numpy as np

import hydra_jax as hj
from bench.precision import PRECISIONS, at_precision
from bench.processes import alternating, median_of, print_worker, time_calls
from hydra_jax.evaluation import xla_flops


def batch_of(args: argparse.Namespace) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    if args.family in IMAGES:
        images = rng.normal(size=(args.batch, 3, args.image_size, args.image_size))
        return {"pixel_values": images.astype(np.float32)}
    ids = rng.integers(1000, 30000, (args.batch, args.tokens))
    return {"input_ids": ids.astype(np.int32), "attention_mask": np.ones_like(ids, np.int32)}


def dinov2_small(path: Path) -> None:
    """A random DINOv2-S (the shape of facebook/dinov2-small) saved to `path`."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.Dinov2Config(hidden_size=384, num_hidden_layers=12,
                                       num_attention_heads=6, mlp_ratio=4, patch_size=14,
                                       image_size=518)  # fmt: skip
    transformers.Dinov2Model(config).save_pretrained(path)


def siglip_base(path: Path) -> None:
    """A random SigLIP-B/16 image classifier (google/siglip-base-patch16-224's vision tower, a
    10-way classifier) saved to `path`."""
    import torch
    import transformers

    torch.manual_seed(0)
    vision = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                  intermediate_size=3072, patch_size=16, image_size=224)  # fmt: skip
    config = transformers.SiglipConfig(vision_config=vision, num_labels=10)
    transformers.SiglipForImageClassification(config).save_pretrained(path)


def deberta_v3_small(path: Path) -> None:
    """A random DeBERTa-v3-small (the shape of microsoft/deberta-v3-small) saved to `path`."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.DebertaV2Config(
        vocab_size=128100, hidden_size=768, num_hidden_layers=6, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=512, relative_attention=True,
        position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True,
        pos_att_type="p2c|c2p", layer_norm_eps=1e-7, max_relative_positions=-1,
        position_biased_input=False, type_vocab_size=0,
    )  # fmt: skip
    transformers.DebertaV2Model(config).save_pretrained(path)


def modernbert_base(path: Path) -> None:
    """A random ModernBERT-base (the shape of answerdotai/ModernBERT-base) saved to `path`."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        vocab_size=50368, hidden_size=768, num_hidden_layers=22, num_attention_heads=12,
        intermediate_size=1152, local_attention=128, global_attn_every_n_layers=3,
        pad_token_id=50283,
    )  # fmt: skip
    transformers.ModernBertModel(config).save_pretrained(path)


RANDOM_MODELS = {"deberta": deberta_v3_small, "modernbert": modernbert_base,
                 "dinov2": dinov2_small, "siglip": siglip_base}  # fmt: skip
IMAGES = {"dinov2": "DINOv2-S", "siglip": "SigLIP-B/16 classifier"}
OUTPUT = {"siglip": "logits"}  # what is timed and compared (else last_hidden_state)
NAMES = {"minilm": "MiniLM-L6", "deberta": "DeBERTa-v3-small", "modernbert": "ModernBERT-base"}


def worker(side: str, args: argparse.Namespace) -> dict[str, Any]:
    """One side's forward times; its output is saved to `args.out/SIDE.npy` for the check."""
    path = Path(args.checkpoint) if args.checkpoint else hj.minilm_l6_path()
    batch, output = batch_of(args), OUTPUT.get(args.family, "last_hidden_state")
    if side == "ours":
        model = at_precision(hj.from_pretrained(path), args.dtype)
        forward = jax.jit(lambda p, b: getattr(model.apply(p, **b), output))
        compiled = forward.lower(model.params, batch).compile()
        out = compiled(model.params, batch).astype(np.float32)
        np.save(Path(args.out) / "ours.npy", np.asarray(out))
        times = time_calls(lambda: jax.block_until_ready(compiled(model.params, batch)),
                           args.repeats)  # fmt: skip
        return {"times": times, "flops": xla_flops(compiled)}
    import torch
    import transformers

    classifier = output == "logits"
    auto = transformers.AutoModelForImageClassification if classifier else transformers.AutoModel
    ref = auto.from_pretrained(path).eval()  # its default attention kernel
    inputs = {k: torch.tensor(v) for k, v in batch.items()}

    low = args.dtype != "float32"

    def run() -> Any:
        with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=low):
            return getattr(ref(**inputs), output)

    np.save(Path(args.out) / "torch.npy", run().float().numpy())
    return {"times": time_calls(run, args.repeats), "threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", default=None)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--family", choices=(*NAMES, *IMAGES), default="minilm")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--checkpoint", default="")
    parser.add_argument("--out", default="")
    parser.add_argument("--dtype", choices=PRECISIONS, default="float32")
    args = parser.parse_args(argv)
    args.batch = args.batch or (8 if args.family in IMAGES else 32)
    if args.worker:
        print_worker(worker(args.worker, args))
        return
    with tempfile.TemporaryDirectory() as out:
        forwarded = [*(argv if argv is not None else sys.argv[1:]), "--out", out]
        if args.family in RANDOM_MODELS:
            RANDOM_MODELS[args.family](Path(out) / args.family)
            forwarded += ["--checkpoint", str(Path(out) / args.family)]
        results = alternating("bench.forward", ["ours", "torch"], forwarded, args.rounds)
        diff = np.abs(np.load(Path(out) / "ours.npy") - np.load(Path(out) / "torch.npy")).max()
    ours, theirs = median_of(results["ours"]), median_of(results["torch"])
    flops = results["ours"][0]["flops"]
    if args.family in IMAGES:
        shape = f"{IMAGES[args.family]} forward, batch {args.batch} x {args.image_size} px"
    else:
        shape = f"{NAMES[args.family]} forward, batch {args.batch} x {args.tokens} tokens"
    print(f"{shape}, CPU {args.dtype}; "
          f"{args.rounds} rounds of separate processes taken in turns, {args.repeats} calls each; "
          f"torch threads {results['torch'][0]['threads']}")  # fmt: skip
    print(f"max |ours - torch| on {OUTPUT.get(args.family, 'last_hidden_state')}: {diff:.2e}")
    print(f"{'program':<24}{'median ms':>12}")
    print(f"{'hydra_jax (jit)':<24}{ours * 1e3:>12.2f}")
    print(f"{'transformers (torch)':<24}{theirs * 1e3:>12.2f}")
    print(f"ratio ours / torch: {ours / theirs:.3f}  (target <= 1.0)")
    print(f"XLA FLOPs per batch: {flops / 1e9:.2f} GFLOP; "
          f"achieved {flops / ours / 1e9:.1f} GFLOP/s")  # fmt: skip


if __name__ == "__main__":
    main()
