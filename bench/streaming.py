"""Streamed image data: peak memory of the generic study against the number of images, and the
input pipeline's throughput beside the training step's.

Memory: the generic study (`configs/custom.py:smoke`, method `single`, one epoch at batch 32)
trains and evaluates a tiny DINOv2 whose image processor is DINOv2's (resize the short side to
256, bicubic, centre crop 224) on N small JPEGs (64 x 48, two classes), for N = 2,000 and
20,000, read as a `folder:`, an uncompressed `npz:` archive (the same images as arrays) and a
saved HF dataset (the JPEG bytes). Train and evaluate run as separate processes; each one's
peak RSS comes from `wait4`. Streaming holds batches, not sets: the peak at 20,000 should be
within 10% of the one at 2,000.

Throughput (images/s, one process): decoding + preprocessing batches of 64 in 1 and 2
background threads (`hydra_jax.data.dataset.prefetched`, as prediction and Grain's loader do),
for the 224-px JPEGs and for 28 x 28 PNGs with the study ViT's processor
(`configs/vit_fmnist.py`), beside each model's jitted training step (batch 32 of the tiny
DINOv2; batch 64 of the study ViT, as `bench.train` times it).

    .venv/bin/python -m bench.streaming [--sizes 2000,20000] [--kinds folder,npz,hf]
        [--out runs/bench_streaming] [--only memory|throughput]
    .venv/bin/python -m bench.streaming --record "2-core Intel Xeon ..." [--out ...]

`--record CPU` writes the tables `streaming_memory` and `streaming_pipeline` of
docs/data/benchmarks.json from `OUT/results.json` (the docs' figures; `make tables` renders them),
captioned with CPU and today's date.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from PIL import Image

import hydra_jax as hj
from bench.train import image_batch, our_step, vit_model
from hydra_jax import testing
from hydra_jax.data import files
from hydra_jax.data.dataset import prefetched
from hydra_jax.experiments import artefacts
from hydra_jax.models import ViTConfig

REPO = Path(__file__).resolve().parent.parent
WIDTH, HEIGHT = 64, 48


def dinov2_checkpoint(path: Path) -> Path:
    """A tiny DINOv2 encoder at 224 px (patches of 16) with DINOv2's image processor."""
    import transformers

    vit = ViTConfig(
        testing.encoder(layers=2, heads=2, head_dim=8, mlp_dim=32, pre_norm=True), 224, 16, 3
    )
    encoder = dataclasses.replace(vit.encoder, layer_scale=True)
    config = dataclasses.replace(vit, model_type="dinov2", encoder=encoder, pooler=False)
    hj.save_pretrained(hj.Model.init(config, jax.random.key(0)), path)
    transformers.BitImageProcessor(
        size={"shortest_edge": 256},
        crop_size={"height": 224, "width": 224},
        resample=3,  # bicubic
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    ).save_pretrained(path)
    return path


def images(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`n` RGB images `[n, 48, 64, 3]` uint8, class 1 brighter than class 0, and labels."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 2
    low = np.where(labels == 1, 120, 0)[:, None, None, None]
    return (low + rng.integers(0, 136, (n, HEIGHT, WIDTH, 3))).astype(np.uint8), labels


def write_sources(root: Path, n: int) -> dict[str, str]:
    """The same `n` images as a folder of JPEGs, an npz archive and a saved HF dataset."""
    import datasets

    pixels, labels = images(n)
    folder = root / f"folder_{n}"
    if not folder.is_dir():
        for label in (0, 1):
            (folder / f"class_{label}").mkdir(parents=True)
        for i, (image, label) in enumerate(zip(pixels, labels, strict=True)):
            Image.fromarray(image).save(folder / f"class_{label}" / f"{i:06d}.jpg", quality=90)
    archive = root / f"images_{n}.npz"
    if not archive.is_file():
        np.savez(archive, images=pixels, labels=labels)
    saved = root / f"hf_{n}"
    if not saved.is_dir():
        paths = sorted(folder.glob("*/*.jpg"))
        features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
        rows = {
            "image": [{"bytes": p.read_bytes(), "path": None} for p in paths],
            "label": [int(p.parent.name[-1]) for p in paths],
        }
        datasets.Dataset.from_dict(rows, features=features).save_to_disk(saved)
    return {"folder": f"folder:{folder}", "npz": f"npz:{archive}", "hf": f"hf:{saved}"}


def run_stage(stage: str, fields: list[str], workdir: Path) -> dict[str, float]:
    """One stage of the generic study in its own process (started by `bench.rss`, which reads
    its peak RSS): peak RSS (GiB) and wall time."""
    command = [sys.executable, "-m", "bench.rss", sys.executable, str(REPO / f"{stage}.py"),
               "--config", str(REPO / "configs/custom.py") + ":smoke", "--workdir",
               str(workdir), *fields]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    if measured.pop("returncode"):
        raise RuntimeError(f"{stage} failed:\n{done.stderr[-3000:]}")
    return measured


def memory(args: argparse.Namespace, out: Path, checkpoint: Path) -> list[dict[str, Any]]:
    rows = []
    for n in args.sizes:
        specs = write_sources(out / "data", n)
        for kind in args.kinds:
            workdir = out / "runs" / f"{kind}_{n}"
            fields = [f"--config.model={checkpoint}", f"--config.data.train={specs[kind]}",
                      f"--config.data.test={specs[kind]}", "--config.methods=single",
                      "--config.train.batch_size=32", "--config.train.epochs=1",
                      "--config.eval.batch_size=64"]  # fmt: skip
            row: dict[str, Any] = {"kind": kind, "images": n}
            for stage in ("train", "evaluate"):
                measured = run_stage(stage, fields, workdir)
                row |= {f"{stage}_{k}": v for k, v in measured.items()}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def pipeline_rate(spec: str, checkpoint: Path, threads: int, n: int, batch: int = 64) -> float:
    """Images/s of decoding + preprocessing `n` images of `spec` in batches, `threads` ahead."""
    split = files.read(spec, progress=False)
    stream = files.to_dataset(split, checkpoint, None)
    starts = range(0, n, batch)

    def make(start: int) -> Any:
        return stream.batch(np.arange(start, start + batch) % len(stream))

    for _ in prefetched(make, starts[:2], threads):  # warm: the processor's first calls
        pass
    begin = time.perf_counter()
    for _ in prefetched(make, starts, threads):
        pass
    return len(starts) * batch / (time.perf_counter() - begin)


def step_rate(model: hj.Model, batch: dict[str, np.ndarray], repeats: int = 10) -> float:
    """Images/s of `model`'s jitted training step (AdamW, clipping, dropout) at `batch`."""
    call = our_step(model, batch)
    for _ in range(2):
        call()
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        call()
        times.append(time.perf_counter() - begin)
    return len(batch["labels"]) / float(np.median(times))


def throughput(out: Path, checkpoint: Path, n: int = 1024) -> list[dict[str, Any]]:
    specs = write_sources(out / "data", 2000)
    vit = vit_model()
    vit_checkpoint = out / "vit_fmnist"
    if not vit_checkpoint.is_dir():
        artefacts.publish(vit, vit_checkpoint, our_pixels=True)
    grey = out / "data" / "grey_28"
    if not grey.is_dir():
        rng = np.random.default_rng(0)
        for label in (0, 1):
            (grey / f"class_{label}").mkdir(parents=True)
            for i in range(500):
                pixels = rng.integers(0, 256, (28, 28), dtype=np.uint8)
                Image.fromarray(pixels).save(grey / f"class_{label}" / f"{i:04d}.png")
    dinov2 = hj.from_pretrained(checkpoint)
    dinov2 = hj.Model.init(dataclasses.replace(dinov2.config, num_labels=2), jax.random.key(0))
    rows = []
    for name, spec, ckpt, model, batch in (
        ("224-px JPEGs, tiny DINOv2", specs["folder"], checkpoint, dinov2, 32),
        ("28-px PNGs, study ViT", f"folder:{grey}", vit_checkpoint, vit, 64),
    ):
        row: dict[str, Any] = {"input": name, "step_batch": batch}
        for threads in (1, 2):
            row[f"pipeline_{threads}"] = pipeline_rate(spec, ckpt, threads, n)
        row["step"] = step_rate(model, image_batch(model.config, batch))
        row["keeps_up"] = row["pipeline_2"] >= row["step"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def record(out: Path, cpu: str, data: Path = REPO / "docs" / "data" / "benchmarks.json") -> None:
    """The tables of `out/results.json` into the docs' data file `data`."""
    import datetime

    results = json.loads((out / "results.json").read_text())
    sizes = sorted({r["images"] for r in results["memory"]})
    low, high = sizes[0], sizes[-1]
    kinds = {"folder": "`folder:` JPEGs", "npz": "`npz:` (np.savez)", "hf": "`hf:` (JPEG bytes)"}
    rows = []
    for kind, label in kinds.items():
        by_size = {r["images"]: r for r in results["memory"] if r["kind"] == kind}
        row: dict[str, Any] = {"source": label}
        for stage in ("train", "evaluate"):
            row[f"{stage}_low"] = by_size[low][f"{stage}_peak_rss_gb"]
            row[f"{stage}_high"] = by_size[high][f"{stage}_peak_rss_gb"]
            row[f"{stage}_ratio"] = row[f"{stage}_high"] / row[f"{stage}_low"]
            row[f"{stage}_wall_low"] = by_size[low][f"{stage}_wall_s"]
            row[f"{stage}_wall_high"] = by_size[high][f"{stage}_wall_s"]
        rows.append(row)
    memory = {
        "columns": [
            {"name": "source", "header": "source"},
            {"name": "train", "header": f"train: peak RSS GiB, {low:,} / {high:,} images",
             "keys": ["train_low", "train_high"], "fmt": ".2f"},
            {"name": "train_ratio", "header": "ratio", "fmt": ".3f"},
            {"name": "evaluate", "header": f"evaluate: peak RSS GiB, {low:,} / {high:,}",
             "keys": ["evaluate_low", "evaluate_high"], "fmt": ".2f"},
            {"name": "evaluate_ratio", "header": "ratio", "fmt": ".3f"},
            {"name": "wall_low", "header": f"train / evaluate s, {low:,} images",
             "keys": ["train_wall_low", "evaluate_wall_low"], "fmt": ".0f"},
            {"name": "wall_high", "header": f"{high:,} images",
             "keys": ["train_wall_high", "evaluate_wall_high"], "fmt": ".0f"},
        ],
        "rows": rows,
    }  # fmt: skip
    pipeline = {
        "columns": [
            {"name": "input", "header": "images"},
            {"name": "pipeline", "header": "decode + preprocess, images/s: 1 thread / 2 threads",
             "keys": ["pipeline_1", "pipeline_2"], "fmt": ",.0f"},
            {"name": "step", "header": "training step, images/s", "fmt": ",.0f"},
            {"name": "step_batch", "header": "step batch"},
        ],
        "rows": results["throughput"],
    }  # fmt: skip
    today = datetime.date.today().isoformat()
    command = "`python -m bench.streaming`"
    tables = json.loads(data.read_text())
    for name, table in (("streaming_memory", memory), ("streaming_pipeline", pipeline)):
        tables[name] = {"cpu": cpu, "date": today, "source": command, **table}
    sys.path.insert(0, str(REPO / "scripts"))
    from tables import dump  # the data files' layout: one line per column and per row

    data.write_text(dump(tables))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="2000,20000")
    parser.add_argument("--kinds", default="folder,npz,hf")
    parser.add_argument("--out", default="runs/bench_streaming")
    parser.add_argument("--only", default="", choices=["", "memory", "throughput"])
    parser.add_argument("--record", default="", help="the CPU, in words: write the docs' tables")
    args = parser.parse_args(argv)
    if args.record:
        record(Path(args.out), args.record)
        return
    args.sizes = [int(n) for n in args.sizes.split(",")]
    args.kinds = args.kinds.split(",")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = out / "dinov2_224"
    if not checkpoint.is_dir():
        dinov2_checkpoint(checkpoint)
    results: dict[str, Any] = {"cpu": os.cpu_count()}
    if args.only in ("", "throughput"):
        results["throughput"] = throughput(out, checkpoint)
    if args.only in ("", "memory"):
        results["memory"] = memory(args, out, checkpoint)
        for kind in args.kinds:
            by_size = {r["images"]: r for r in results["memory"] if r["kind"] == kind}
            low, high = by_size[min(args.sizes)], by_size[max(args.sizes)]
            for stage in ("train", "evaluate"):
                ratio = high[f"{stage}_peak_rss_gb"] / low[f"{stage}_peak_rss_gb"]
                print(f"{kind} {stage}: peak RSS at {max(args.sizes)} / at {min(args.sizes)} "
                      f"images = {ratio:.3f}")  # fmt: skip
    (out / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
