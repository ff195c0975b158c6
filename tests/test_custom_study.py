"""The generic study (configs/custom.py, `hydra-jax --config custom`) end to end on tiny files:
a text encoder with CSV / JSON Lines files (string labels) from the command line, a ViT with
image folders and `.npz` OOD sets, and a prepared TFDS dataset."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import ml_collections
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tokenizers
from absl import flags
from ml_collections import ConfigDict, config_flags
from PIL import Image, ImageFilter

import hydra_jax as hj
from configs import custom as custom_config
from hydra_jax import testing
from hydra_jax.data import image_index
from hydra_jax.data.files import DataError
from hydra_jax.experiments import engine, study_inputs
from hydra_jax.models import (
    BertConfig,
    CLIPClassifierConfig,
    ModernBertConfig,
    RelativeAttention,
    SiglipClassifierConfig,
    SiglipConfig,
    SiglipTextConfig,
    SiglipVisionConfig,
    ViTConfig,
)

pytestmark = pytest.mark.slow  # studies end to end, meshes, several processes

REPO = Path(__file__).parent.parent
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                   "special_tokens_map.json")  # fmt: skip
GOOD = ["a joy", "wonderful and warm", "a great film", "moving and funny", "superb acting"]
BAD = ["dull", "a tedious mess", "boring and long", "awful script", "a waste of time"]


@pytest.fixture(scope="module")
def text_encoder_dir(tmp_path_factory) -> Path:
    """A tiny BERT encoder without a classifier, with the MiniLM tokenizer."""
    path = tmp_path_factory.mktemp("encoder")
    config = BertConfig(testing.encoder(layers=2, heads=4, head_dim=3, mlp_dim=11),
                        vocab_size=30522, max_positions=40, type_vocab_size=2)  # fmt: skip
    hj.save_pretrained(hj.Model.init(config, jax.random.key(0)), path)
    for name in TOKENIZER_FILES:
        shutil.copy(hj.minilm_l6_path() / name, path / name)
    return path


def write_csv(path: Path, rows: list[tuple[str, str]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(rows)


def smoke_config() -> ml_collections.ConfigDict:
    """The smoke variant at 2 members (its own 3 cost the suite time)."""
    config = custom_config.get_config("smoke")
    config.update(ensemble_size=2, num_members=2)
    return config


def bash_blocks(page: Path) -> list[str]:
    """A docs page's bash blocks."""
    return re.findall(r"^```bash\n(.*?)^```$", page.read_text(), flags=re.S | re.M)


def bash_block(page: Path) -> str:
    """The first bash block of a docs page."""
    return bash_blocks(page)[0]


def commands(block: str) -> list[list[str]]:
    """The `python train.py` / `evaluate.py` commands of a bash block, as argument lists."""
    lines = block.replace("\\\n", " ").splitlines()
    return [shlex.split(line, comments=True) for line in lines if line.startswith("python ")]


def command_config(command: list[str], variant: str = "smoke") -> tuple[str, ConfigDict, str]:
    """(stage, config, workdir) of a `python train.py|evaluate.py --config FILE ...` command,
    parsed by the flags the CLI parses (the config file at its `variant`, from the clone)."""
    python, script, *arguments = command
    assert python == "python" and script in ("train.py", "evaluate.py"), command
    spec = arguments.index("--config") + 1
    arguments[spec] = f"{REPO / arguments[spec].partition(':')[0]}:{variant}"
    argv = [script, *arguments]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file(
        "config", None, "", flag_values=values, lock_config=True, sys_argv=argv
    )
    flags.DEFINE_string("workdir", None, "", flag_values=values)
    values(argv)
    return script.removesuffix(".py"), values.config, values.workdir


@pytest.mark.processes
def test_the_tutorials_command_runs_as_written(tmp_path, text_encoder_dir):
    """docs/your_data.md's `hydra-jax` commands, in a folder outside the clone holding the files
    they name (the smoke variant)."""
    rng = np.random.default_rng(0)
    train = [(t, "good") for t in GOOD] * 2 + [(t, "bad") for t in BAD] * 2
    write_csv(tmp_path / "train.csv", [train[i] for i in rng.permutation(len(train))])
    test = [{"text": t, "label": "good" if t in GOOD else "bad"} for t in GOOD[:3] + BAD[:3]]
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in test))
    (tmp_path / "news.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in ["rates rise", "storm hits coast"])
    )
    pq.write_table(pa.table({"text": ["five stars", "broke in a week", "fast delivery"]}),
                   tmp_path / "reviews.parquet")  # fmt: skip
    (tmp_path / "path" / "to").mkdir(parents=True)
    (tmp_path / "path" / "to" / "checkpoint").symlink_to(text_encoder_dir)
    script = bash_block(REPO / "docs" / "your_data.md")
    assert script.count("--config custom ") == 2
    # The smoke variant, at 2 members (its own 3 cost the suite time; 3 runs in the studies).
    smoke = "--config custom:smoke --config.ensemble_size=2 --config.num_members=2 "
    script = script.replace("--config custom ", smoke)
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # this venv's `hydra-jax`
    done = subprocess.run(
        ["bash", "-e", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PATH": path},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    workdir = tmp_path / "runs" / "mine"
    results = json.loads((workdir / "results.json").read_text())
    assert list(results["methods"]) == ["deep_ensemble", "hydra_taylor", "mc_dropout", "single"]
    for name, result in results["methods"].items():
        assert 0 <= result["id"]["acc"] <= 1 and np.isfinite(result["id"]["nll"]), name
        assert set(result["ood"]) == {"news", "reviews", "mean"}, name
        predictions = np.load(workdir / "predictions" / f"{name}.npz")
        assert predictions["id_logits"].shape[0] == 6
        assert predictions["ood_news_logits"].shape[0] == 2
        assert predictions["ood_reviews_logits"].shape[0] == 3
    assert json.loads((workdir / "classes.json").read_text()) == ["bad", "good"]
    report = (workdir / "report.md").read_text()
    assert "## Training loss" in report and "`members/member_1`" in report
    assert "`hydra_members/taylor/member_1`" in report
    assert (workdir / "plots" / "training_loss.png").is_file()
    assert list((workdir / "members" / "member_0" / "tensorboard").glob("events.out.tfevents.*"))
    member = workdir / "hf" / "member_1"
    assert (member / "tokenizer.json").is_file()  # a published member carries its tokenizer
    assert hj.from_pretrained(member).config.num_labels == 2
    hydra = hj.load_model(workdir / "fused" / "taylor")
    assert hydra.config.num_members == 2


def image_folder(root: Path, rng: np.random.Generator, n: int, size: int = 10) -> Path:
    """`n` images per class: class `bright` light, class `dark` dark (learnable)."""
    for label, low in (("bright", 150), ("dark", 0)):
        (root / label).mkdir(parents=True)
        for i in range(n):
            pixels = rng.integers(low, low + 100, (size, size), dtype=np.uint8)
            Image.fromarray(pixels).save(root / label / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def vit_dir(tmp_path_factory) -> Path:
    """A tiny grey-image ViT without a classifier; its processor resizes to 8 x 8."""
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("vit")
    config = ViTConfig(
        testing.encoder(layers=2, heads=2, head_dim=4, mlp_dim=10, pre_norm=True), 8, 4, 1
    )
    hj.save_pretrained(hj.Model.init(config, jax.random.key(1)), path)
    processor = transformers.ViTImageProcessor(
        size={"height": 8, "width": 8}, image_mean=[0.5], image_std=[0.5], do_convert_rgb=False
    )
    processor.save_pretrained(path)
    return path


def test_image_study_with_folders_and_npz_ood_sets(tmp_path, vit_dir, monkeypatch):
    rng = np.random.default_rng(1)
    folders = {s: image_folder(tmp_path / s, rng, n) for s, n in (("train", 8), ("val", 4),
                                                                  ("test", 4))}  # fmt: skip
    # A shifted copy of the test set, of another file kind: the images blurred, in an archive.
    shifted = {"images": [], "labels": []}
    for label in ("bright", "dark"):
        for path in sorted((folders["test"] / label).iterdir()):
            image = Image.open(path).filter(ImageFilter.GaussianBlur(2))
            shifted["images"].append(np.asarray(image))
            shifted["labels"].append(label)
    np.savez(tmp_path / "blurred.npz", images=np.stack(shifted["images"]),
             labels=np.array(shifted["labels"]))  # fmt: skip
    np.savez(tmp_path / "noise.npz", images=rng.integers(0, 256, (6, 12, 12), dtype=np.uint8))
    np.savez(tmp_path / "noise_val.npz", images=rng.integers(0, 256, (8, 9, 9), dtype=np.uint8))
    config = smoke_config()
    config.model = str(vit_dir)
    config.data.update(train=f"folder:{folders['train']}", validation=f"folder:{folders['val']}",
                       test=f"folder:{folders['test']}", ood=f"noise=npz:{tmp_path / 'noise.npz'}",
                       ood_validation=f"noise=npz:{tmp_path / 'noise_val.npz'}",
                       shift=f"blur=npz:{tmp_path / 'blurred.npz'}")  # fmt: skip
    config.methods = "single,hydra_circuit"
    config.data.cache = str(tmp_path / "pixels")
    run = tmp_path / "runs" / "mine"  # where docs/your_data.md's pruning command reads it
    engine.train(config, run)
    decoded = []
    with monkeypatch.context() as patch:
        patch.setattr(image_index, "decode", lambda *args: decoded.append(args))
        results = engine.evaluate(config, run)
    assert not decoded  # every set read from the pixel cache that training wrote
    assert set(results["methods"]) == {"single", "hydra_circuit"}
    for name, got in results["methods"].items():  # the shifted set through every evaluator
        assert set(got["shift"]) == {"blur"}, name
        assert set(got["shift"]["blur"]) >= {"acc", "nll", "ece"}
        assert set(got["calibration"]["shift"]) == {"blur"}
        assert set(got["conformal"]["lac"]) >= {"test", "shift_blur"}
    report = (run / "report.md").read_text()
    assert "## Dataset shift" in report and "| blur | mean |" in report
    config.data.cache = ""  # decoded again, batch by batch: the same results
    for name, got in engine.evaluate(config, run)["methods"].items():
        assert got["id"] == results["methods"][name]["id"]
        assert got["ood"] == results["methods"][name]["ood"]
    assert (run / "pruned" / "circuit").is_dir()  # member 0 alone, saved too
    sets = json.loads((run / "head_sets.json").read_text())["circuit"]
    assert np.array(sets).shape == (2, 2, 2)  # [M, L, N]: members of one head per layer
    assert np.all(np.array(sets).sum(-1) == 1)
    assert results["methods"]["single"]["ood"]["noise"]["auroc"] >= 0
    # Pruning curves of that run's member 0, on its files (HIES's alpha on data.validation):
    # docs/your_data.md's commands as written, at the smoke variant.
    (train, prune, workdir), (evaluate, again, same) = map(
        command_config, commands(bash_blocks(REPO / "docs" / "your_data.md")[1])
    )
    assert (train, evaluate, workdir) == ("train", "evaluate", same) and prune == again
    monkeypatch.chdir(tmp_path)  # the commands' paths are relative to where they run
    engine.train(prune, workdir)
    curves = engine.evaluate(prune, workdir)["curves"]
    assert set(curves) == set(prune.pruning_curves.criteria)
    assert curves["his"]["0.0"]["acc"] == results["methods"]["single"]["id"]["acc"]  # unpruned
    assert curves["his"]["0.6"]["heads_kept"] == 2  # of 4
    # No validation data for the circuit strategy: refused before anything is written.
    config.data.ood_validation = ""
    with pytest.raises(ValueError, match=r"set data\.validation and data\.ood_validation"):
        engine.train(config, tmp_path / "other")
    assert not (tmp_path / "other").exists()


def dual_encoder_dir(family: str, path: Path) -> Path:
    """A tiny CLIP or SigLIP (both towers) with its family's image processor: RGB, 8 x 8."""
    transformers = pytest.importorskip("transformers")
    if family == "clip":
        model = testing.clip(vision={"heads": 2, "mlp_dim": 12})
        square = {"height": 8, "width": 8}
        processor = transformers.CLIPImageProcessor(size=square, crop_size=square)
    else:
        towers = {"activation": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6, "pre_norm": True}
        vision = SiglipVisionConfig(testing.encoder(**towers, heads=2, mlp_dim=12), 8, 4)
        text = SiglipTextConfig(testing.encoder(**towers, heads=2), 30, 8, vision.encoder.width)
        model = SiglipConfig(text, vision)
        processor = transformers.SiglipImageProcessor(size={"height": 8, "width": 8})
    hj.save_pretrained(testing.tiny(model, seed=3), path)
    processor.save_pretrained(path)
    word_level_tokenizer(path)
    return path


WORDS = ("a", "photo", "of", ".", "blurry", "bright", "dark")  # ids 2.., 0 pads, 29 ends


def word_level_tokenizer(path: Path) -> None:
    """A tokenizer of `WORDS` that ends every text with id 29 (the tiny CLIP's EOS)."""
    vocab = {"<pad>": 0, "<unk>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}, "</s>": 29}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", 29)]
    )
    tokenizer.save(str(path / "tokenizer.json"))


def by_hand(texts: list[str], length: int) -> dict[str, np.ndarray]:
    """`texts` as `WORDS` ids and EOS, padded with 0 to `length`."""
    rows = [[WORDS.index(w) + 2 for w in re.findall(r"\w+|[^\w\s]", t)] + [29] for t in texts]
    ids = np.array([r + [0] * (length - len(r)) for r in rows], np.int32)
    return {"input_ids": ids, "attention_mask": (ids > 0).astype(np.int32)}


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_a_zero_shot_hydra_on_a_dual_encoder(tmp_path, vit_dir, family):
    """`zero_shot.enabled`: prompts name the class folders, nothing trains, the Hydra's members
    are the zero-shot classifier pruned and fused as they are; a held-out class is reported
    apart. SigLIP pads its prompts to its 8
    positions (its text tower reads the last one), CLIP to the longest."""
    path = dual_encoder_dir(family, tmp_path / family)
    folders = {s: image_folder(tmp_path / s, np.random.default_rng(3), 8) for s in ("a", "b")}
    study = smoke_config()
    templates = ("a {}.", "a photo of a {}.")
    study.update(model=str(path), methods="single,deep_ensemble")
    study.data.update(train=f"folder:{folders['a']}", test=f"folder:{folders['b']}")
    study.zero_shot.update(enabled=True, templates=templates)
    run = tmp_path / "run"
    with pytest.raises(ValueError, match=r"no classifier, so \[.deep_ensemble.\] cannot run"):
        engine.train(study, run)
    study.update(model=str(vit_dir), methods="single,pruned_taylor,hydra_taylor")
    with pytest.raises(DataError, match=r"needs a dual encoder \(CLIP, SigLIP, ViT-BERT\)"):
        engine.train(study, run)
    assert not run.exists()
    study.model = str(path)
    study.zero_shot.held_out = ("dark",)  # kept out of head selection, reported apart
    study.calibration_size = 8  # the training images of the seen class
    assert set(study_inputs.load_data(study).study.train.labels) == {0}
    engine.train(study, run)
    results = engine.evaluate(study, run)
    assert set(results["methods"]) == {"single", "pruned_taylor", "hydra_taylor"}
    with np.load(run / "predictions" / "single.npz") as npz:
        probs, labels = npz["id_probs"], npz["labels"]
    held = labels == 1  # "dark", the second class by name
    split = results["methods"]["single"]["zero_shot"]
    assert split["held_out"] == hj.metrics.classification(probs[held], labels[held])
    assert split["seen"] == hj.metrics.classification(probs[~held], labels[~held])
    saved = hj.load_model(run / "zero_shot")
    length = 8 if family == "siglip" else 7  # the longest prompt: 6 words, ".", EOS
    expected = hj.models.prompt_embeddings(hj.from_pretrained(path), ("bright", "dark"),
                                           templates, lambda t: by_hand(t, length))  # fmt: skip
    np.testing.assert_allclose(saved.params["class_embeds"], expected, rtol=0, atol=1e-6)
    sets = np.array(json.loads((run / "head_sets.json").read_text())["taylor"], bool)
    untrained = hj.hydra.fuse(hj.hydra.members_from(saved, sets))
    jax.tree.map(np.testing.assert_array_equal, hj.load_model(run / "fused" / "taylor").params,
                 untrained.params)  # fmt: skip


def test_the_zero_shot_command_runs_as_written(tmp_path, monkeypatch):
    """docs/your_data.md's zero-shot command (the smoke variant at 2 members, as the tiny CLIP
    has 2 heads per layer) on image folders named by their classes: nothing trains, the Hydra is
    the zero-shot classifier pruned and fused."""
    (command,) = commands(bash_blocks(REPO / "docs" / "your_data.md")[2])
    stage, config, workdir = command_config(command)
    assert stage == "train" and config.zero_shot.enabled
    config.update(ensemble_size=2, num_members=2)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "path" / "to").mkdir(parents=True)
    dual_encoder_dir("clip", tmp_path / "path" / "to" / "clip")
    for split in ("train", "test"):
        image_folder(tmp_path / split, np.random.default_rng(5), 8)
    engine.train(config, workdir)
    fused = hj.load_model(Path(workdir) / "fused" / "taylor")
    assert fused.config.num_members == 2
    assert not (Path(workdir) / "members").exists()  # nothing was trained


def test_an_image_that_does_not_decode_stops_the_study_or_is_left_out(tmp_path, vit_dir):
    """A truncated JPEG passes the index's header check; training stops at it with its name,
    or, with `data.skip_bad_images`, the study runs without it and the report names it."""
    import io

    folders = {s: image_folder(tmp_path / s, np.random.default_rng(3), 6) for s in ("a", "b")}
    buffer = io.BytesIO()
    Image.fromarray(np.full((10, 10), 40, np.uint8)).save(buffer, format="JPEG")
    bad = folders["a"] / "dark" / "zz.jpg"
    bad.write_bytes(buffer.getvalue()[: buffer.getvalue().index(b"\xff\xda") + 16])
    study = smoke_config()
    study.model = str(vit_dir)
    study.data.update(train=f"folder:{folders['a']}", test=f"folder:{folders['b']}")
    study.methods = "single"
    study.train.batch_size = 13  # every training image in the one step
    with pytest.raises(DataError, match=rf"{bad}: not a readable image"):
        engine.train(study, tmp_path / "stops")
    study.data.skip_bad_images = True
    study.train.batch_size = 12  # the 12 that decode
    engine.train(study, tmp_path / "run")
    results = engine.evaluate(study, tmp_path / "run")
    assert results["data"]["skipped_images"] == {f"folder:{folders['a']}": [str(bad)]}
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Images left out" in report and str(bad) in report


@pytest.mark.parametrize("family", ["deit", "dinov2", "clip", "siglip"])
def test_the_image_study_runs_on_other_vision_families(tmp_path, vit_dir, family):
    """A DeiT (a distillation token and its teacher's head), a DINOv2 (layer scale, a classifier
    on CLS and the mean patch), a CLIP and a SigLIP model (both towers: the vision tower becomes
    HF's CLIPForImageClassification or SiglipForImageClassification) through the generic study,
    as the ViT goes. Each family's fused network equals its members in
    tests/test_vision_families.py; here CLIP's runs through the study's Hydra too."""
    vit = hj.from_pretrained(vit_dir).config
    if family in ("clip", "siglip"):
        path = dual_encoder_dir(family, tmp_path / family)
        config = hj.from_pretrained(path).config.vision
    elif family == "deit":
        config = dataclasses.replace(vit, model_type="deit", distillation_token=True,
                                     distilled_head=True, num_labels=2)  # fmt: skip
    else:
        encoder = dataclasses.replace(vit.encoder, layer_scale=True, mlp_dim=16)
        config = dataclasses.replace(vit, model_type="dinov2", encoder=encoder, pooler=False,
                                     num_labels=2)  # fmt: skip
    if family not in ("clip", "siglip"):
        path = tmp_path / family
        hj.save_pretrained(hj.Model.init(config, jax.random.key(2)), path)
        shutil.copy(vit_dir / "preprocessor_config.json", path)
    folders = {s: image_folder(tmp_path / s, np.random.default_rng(2), 8) for s in ("a", "b")}
    study = smoke_config()
    study.model = str(path)
    study.data.update(train=f"folder:{folders['a']}", test=f"folder:{folders['b']}")
    study.methods = "single,hydra_taylor" if family == "clip" else "single"
    engine.train(study, tmp_path / "run")
    results = engine.evaluate(study, tmp_path / "run")
    assert set(results["methods"]) == set(study.methods.split(","))
    member = hj.from_pretrained(tmp_path / "run" / "hf" / "member_0").config
    dual = {CLIPClassifierConfig: "clip", SiglipClassifierConfig: "siglip"}
    kind = dual.get(type(member)) or member.model_type
    assert kind == family and member.encoder == config.encoder


def test_a_prepared_tfds_dataset_feeds_the_study(tmp_path, text_encoder_dir, synthetic_data_dir):
    """A TFDS dataset prepared in the data dir (integer labels named "0", "1"), a
    Packed-Ensemble of a text checkpoint's architecture (elsewhere it runs on images only,
    tests/test_vision_experiments.py; the BatchEnsemble and LoRA-Ensemble run in the text smoke
    study, tests/test_experiments.py), and both analyses on the user's member 0 and files."""
    hj.data.load("movie_reviews", "test", synthetic_data_dir)  # prepares the embedded builder
    config = smoke_config()
    config.model = str(text_encoder_dir)
    config.data_dir = str(synthetic_data_dir)
    source = "tfds:vader_sentences/movie_reviews"
    config.data.update(train=f"{source}:train", validation=f"{source}:validation",
                       test=f"{source}:test", train_limit=16, eval_limit=8)  # fmt: skip
    config.methods = "single,packed_ensemble"
    config.analyses = "pruning_curves,ablations"
    config.ablations.strategies = ("stratified",)  # taylor's members: the ViT ablation test's
    engine.train(config, tmp_path / "run")
    results = engine.evaluate(config, tmp_path / "run")
    assert set(results["methods"]) == {"single", "packed_ensemble"}
    # The analyses on member 0, in a study without OOD sets (so without OOD AUROC): unpruned,
    # every criterion is the single model's row.
    curves = results["curves"]
    assert set(curves) == set(config.pruning_curves.criteria)
    for criterion, curve in curves.items():
        assert curve["0.0"]["acc"] == results["methods"]["single"]["id"]["acc"], criterion
        assert curve["0.6"]["heads_kept"] == 3, criterion  # round(0.6 x 8) = 5 of 2 x 4 heads gone
        assert "ood_auroc" not in curve["0.0"], criterion
    rows = results["rows"]
    assert [(r["mlp"], r["size"], r["strategy"]) for r in rows] == [
        (mlp, 2, "stratified") for mlp in ("per_member_mlp", "averaged_mlp")
    ]
    assert all(r["heads_per_member"] == 2 and r["ood_auroc"] is None for r in rows)
    report = (tmp_path / "run" / "report.md").read_text()
    assert "Stability % (ours)" in report and "| 2 | 2 | stratified |" in report
    assert "Mean OOD AUROC" not in report
    assert json.loads((tmp_path / "run" / "classes.json").read_text()) == ["0", "1"]
    logits = np.load(tmp_path / "run" / "predictions" / "packed_ensemble.npz")["id_logits"]
    assert logits.shape == (8, config.ensemble_size, 2)  # M members, one pass
    assert hj.from_pretrained(tmp_path / "run" / "hf" / "member_0").config.num_labels == 2


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("pruning_curves.criteria", ("his", "magnitude"), r"criteria: unknown \['magnitude'\]"),
        ("pruning_curves.ratios", (0.0, 1.0),
         r"pruning_curves.ratios must lie in \[0, 1\), got \[1.0\]"),
        ("pruning_curves.alphas", (), "pruning_curves.alphas is empty"),
        ("pruning_curves.random_seeds", (-1,),
         "pruning_curves.random_seeds must be a non-negative integer, got -1"),
        ("ablations.sizes", (1,), "ablations.sizes must be an integer of at least 2, got 1"),
        ("ablations.sizes", (3,), "ablations.sizes: 3 members do not divide the 4 heads per layer"),
        ("ablations.strategies", ("greedy",), r"ablations.strategies: unknown \['greedy'\]"),
    ],
)  # fmt: skip
def test_bad_analysis_settings_are_refused_before_training(
    tmp_path, text_encoder_dir, key, value, message
):
    """Settings given on the command line, refused by key before the workdir is claimed."""
    write_csv(tmp_path / "data.csv", [(t, "good") for t in GOOD] + [(t, "bad") for t in BAD])
    config = smoke_config()
    config.model = str(text_encoder_dir)
    data = f"csv:{tmp_path / 'data.csv'}"
    config.data.update(train=data, validation=data, test=data)
    config.analyses = "pruning_curves,ablations"
    group, name = key.split(".")
    config[group][name] = value
    with pytest.raises(ValueError, match=message):
        engine.train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_bad_study_data_is_refused_before_training(tmp_path, text_encoder_dir):
    write_csv(tmp_path / "train.csv", [("fine", "good"), ("dull", "bad")])
    write_csv(tmp_path / "test.csv", [("fine", "good"), ("meh", "so-so")])
    config = smoke_config()
    config.model = str(text_encoder_dir)
    config.data.update(train=f"csv:{tmp_path / 'train.csv'}", test=f"csv:{tmp_path / 'test.csv'}")
    config.methods = "single"
    with pytest.raises(DataError, match=r"test\.csv: row 2 has label 'so-so', not one of the 2"):
        engine.train(config, tmp_path / "run")
    # A shifted test set labelled with a class the training set does not have.
    write_csv(tmp_path / "shifted.csv", [("fine!", "good"), ("so dull", "awful")])
    config.data.update(test=f"csv:{tmp_path / 'train.csv'}",
                       shift=f"typos=csv:{tmp_path / 'shifted.csv'}")  # fmt: skip
    with pytest.raises(DataError, match=r"shifted\.csv: row 2 has label 'awful', not one of"):
        engine.train(config, tmp_path / "run")
    config.data.shift = f"mean=csv:{tmp_path / 'train.csv'}"
    with pytest.raises(ValueError, match=r"data.shift: 'mean' is the results' mean"):
        engine.train(config, tmp_path / "run")
    config.data.shift = ""
    config.data.test = f"npz:{tmp_path / 'images.npz'}"
    np.savez(tmp_path / "images.npz", images=np.zeros((2, 4, 4), np.uint8), labels=[0, 1])
    with pytest.raises(DataError, match=r"text and images mixed in one study: images in .*npz"):
        engine.train(config, tmp_path / "run")
    config.data.test = f"csv:{tmp_path / 'train.csv'}"
    config.methods = "single,hydra_magic"
    with pytest.raises(ValueError, match=r"config.methods: \['hydra_magic'\]; known: "):
        engine.train(config, tmp_path / "run")
    config.methods = "single,mimo"  # MIMO widens an image classifier's input channels
    with pytest.raises(ValueError, match=r"names mimo, but MIMO takes an image classifier "
                                         r"\(ViT, DeiT, DINOv2\), not BertConfig"):  # fmt: skip
        engine.train(config, tmp_path / "run")
    config.mimo.input_repetition = 1.5
    with pytest.raises(ValueError, match=r"mimo.input_repetition must lie in \[0, 1\], got 1.5"):
        engine.train(config, tmp_path / "run")
    config.mimo.update(input_repetition=0.5, repetitions=0)
    with pytest.raises(ValueError, match=r"mimo.repetitions must be a positive integer, got 0"):
        engine.train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    # The checkpoint has 4 heads per layer: 3 Hydra members were refused only after the Deep
    # Ensemble's members had trained (on enough data to train).
    write_csv(tmp_path / "more.csv", [(t, "good") for t in GOOD] + [(t, "bad") for t in BAD])
    config.mimo.repetitions = 2
    config.data.update(train=f"csv:{tmp_path / 'more.csv'}", test=f"csv:{tmp_path / 'more.csv'}")
    config.update(methods="deep_ensemble,hydra_taylor", num_members=3)
    with pytest.raises(ValueError, match="3 members do not divide the 4 heads per layer"):
        engine.train(config, tmp_path / "hydra")
    assert not (tmp_path / "hydra").exists()


@pytest.mark.parametrize("kind", ["hydra_taylor", "pruning_curves", "ablations"])
def test_a_calibration_larger_than_its_set_is_refused_before_training(
    tmp_path, text_encoder_dir, kind
):
    """Head scores draw `calibration_size` training examples: more than the set has is refused
    before anything trains, for a Hydra's members and for either analysis."""
    write_csv(tmp_path / "data.csv", [(t, "good") for t in GOOD] + [(t, "bad") for t in BAD])
    config = smoke_config()
    config.model = str(text_encoder_dir)
    data = f"csv:{tmp_path / 'data.csv'}"
    config.data.update(train=data, validation=data, test=data)
    if kind == "hydra_taylor":
        config.methods = "single,hydra_taylor"
    else:
        config.update(methods="single", analyses=kind)
        config.ablations.strategies = ("taylor",)
    config.calibration_size = 11
    refused = "calibration_size is 11, but the set head scores are drawn from has 10 examples"
    with pytest.raises(ValueError, match=refused):
        engine.train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def family_config(family: str, bert: BertConfig) -> BertConfig | ModernBertConfig:
    """A classifier of `family` with the tiny BERT's sizes and vocabulary."""
    e = bert.encoder
    if family == "modernbert":  # pre-LN, rotary (even head widths), a local layer, GeGLU
        encoder = dataclasses.replace(
            e, width=2 * e.width, head_dim=2 * e.head_dim, pre_norm=True, qkv_bias=False,
            out_bias=False, mlp_bias=False, norm_bias=False, gated_mlp=True,
            rotary=(160_000.0, 10_000.0), windows=(0, 4), first_norm=False,
        )  # fmt: skip
        return ModernBertConfig(encoder, bert.vocab_size, bert.max_positions, num_labels=2,
                                pooling="mean")  # fmt: skip
    if family == "electra":  # token tables narrower than the encoder, projected up
        return dataclasses.replace(bert, model_type=family, embedding_size=e.width - 3,
                                   pooler=False, num_labels=2)  # fmt: skip
    if family == "deberta-v2":  # relative positions only, 4 log buckets
        relative = RelativeAttention(span=4, buckets=4, max_distance=bert.max_positions)
        return dataclasses.replace(
            bert, model_type=family, encoder=dataclasses.replace(e, relative=relative),
            absolute_positions=False, type_vocab_size=0, pooler=False, num_labels=2,
        )  # fmt: skip
    return dataclasses.replace(
        bert, model_type=family, type_vocab_size=1 if family == "roberta" else 0,
        max_positions=bert.max_positions + 1, pooler=False, num_labels=2,
    )  # fmt: skip


@pytest.mark.parametrize("family", ["roberta", "distilbert", "electra", "deberta-v2", "modernbert"])
def test_the_study_runs_on_other_text_families(tmp_path, text_encoder_dir, family):
    """A RoBERTa (positions counted from its padding id), a DistilBERT (no token types), an
    ELECTRA discriminator (narrow token tables, projected), a DeBERTa-v3 (relative positions) and
    a ModernBERT (rotary, local attention, mean pooling) classifier through the generic study, as
    the BERT encoder goes. Each family's fused network equals its members in
    tests/test_text_families.py; here ModernBERT's runs through the study's Hydra too."""
    config = family_config(family, hj.from_pretrained(text_encoder_dir).config)
    path = tmp_path / family
    hj.save_pretrained(hj.Model.init(config, jax.random.key(1)), path)
    for name in TOKENIZER_FILES:  # the MiniLM tokenizer pads with 0: the model's pad_token_id
        shutil.copy(text_encoder_dir / name, path / name)
    rows = [(t, "good") for t in GOOD] + [(t, "bad") for t in BAD]
    write_csv(tmp_path / "data.csv", rows * 2)  # 20 rows: the smoke study calibrates on 16
    study = smoke_config()
    study.model = str(path)
    data = f"csv:{tmp_path / 'data.csv'}"
    study.data.update(train=data, test=data)
    study.methods = "single,hydra_taylor" if family == "modernbert" else "single"
    engine.train(study, tmp_path / "run")
    results = engine.evaluate(study, tmp_path / "run")
    assert set(results["methods"]) == set(study.methods.split(","))
    member = hj.from_pretrained(tmp_path / "run" / "hf" / "member_0").config
    assert type(member) is type(config) and member.encoder == config.encoder
    assert getattr(member, "model_type", "modernbert") == family
