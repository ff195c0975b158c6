"""Our OOD detectors and selective areas against pytorch-ood's and torch-uncertainty's, on an
evaluated workdir's saved predictions (`predictions/NAME.npz`, float32 features):

    python scripts/peer_check.py runs/demo deep_ensemble --table peers_text --cpu "..."

For each detector, the mean AUROC over the OOD sets of the member-mean score, each member's
detector fitted on its training-subset features (as `evaluate.py`):

- `ours`: `hydra_jax.metrics.detectors` in float64, as the study computes it;
- `peer`: pytorch-ood's detector on the same features in float64 (ViM: float32, which it casts
  to), with the classifier our least squares recovers where it needs one;
- `ours_peer_fit`: our scoring with pytorch-ood's fit (its covariance is the sum of outer
  products plus 1e-6 I, inverted), which isolates the estimator from the code;
- `float16`: ours on the features rounded to float16 (`eval.features_dtype=float16`);
- `ledoit_wolf`: ours with `eval.covariance=ledoit_wolf`.

And torch-uncertainty's AURC / AUGRC of the member-mean confidence against ours. pytorch-ood
0.4 and torch-uncertainty 0.13 are not dependencies: install them beside (`pip install
--no-deps pytorch-ood==0.4.0 torch-uncertainty==0.13.0 torchmetrics lightning-utilities`);
pytorch-ood imports torchvision only for datasets, which `--stub-torchvision` replaces where no
torchvision matches the installed torch. The rows go into `docs/data/conventions.json`.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.machinery
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np

from hydra_jax import metrics
from hydra_jax.experiments.evaluators.base import Predictions, Settings
from hydra_jax.metrics import detectors, selective

DATA = Path(__file__).resolve().parent.parent / "docs" / "data" / "conventions.json"
DETECTORS = ("mahalanobis", "relative_mahalanobis", "vim", "knn", "kl_matching")
RIDGE = 1e-6  # pytorch-ood's, added to the covariance's sum of outer products


def stub_torchvision() -> None:
    """A module finder answering every `torchvision` import with empty classes."""

    class Empty:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

    class Stub(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            return Empty

    class Finder:
        def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
            if name == "torchvision" or name.startswith("torchvision."):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec: Any) -> types.ModuleType:
            module = Stub(spec.name)
            module.__path__ = []
            return module

        def exec_module(self, module: types.ModuleType) -> None:
            pass

    sys.meta_path.insert(0, Finder())


def peer_scores(name: str, train: tuple, sets: dict, num_classes: int, k: int, d: int) -> dict:
    """pytorch-ood's scores `[N]` of one member's sets (`name -> (features, logits)`)."""
    import torch
    from pytorch_ood import detector

    torch.set_default_dtype(torch.float64)  # the buffers pytorch-ood allocates, as the features
    features, labels, logits = (torch.as_tensor(np.asarray(x, np.float64)) for x in train)
    labels = labels.long()
    if name == "mahalanobis":
        fitted = detector.Mahalanobis(None).fit_features(features, labels)
    elif name == "relative_mahalanobis":
        fitted = detector.RMD(None).fit_features(features, labels)
    elif name == "knn":
        fitted = detector.KNN(None, k=k).fit_features(features, labels)
    elif name == "vim":
        W, b = detectors.affine(features.numpy(), logits.numpy())
        vim = detector.ViM(None, d=d, w=torch.as_tensor(W.T), b=torch.as_tensor(b))
        fitted = vim.fit_features(features, labels)
    elif name == "kl_matching":
        fitted = detector.KLMatching(None).fit_logits(logits)
        return {
            n: fitted.predict_logits(torch.as_tensor(np.asarray(z, np.float64))).numpy()
            for n, (_, z) in sets.items()
        }
    else:
        raise ValueError(name)
    return {
        n: fitted.predict_features(torch.as_tensor(np.asarray(x, np.float64))).double().numpy()
        for n, (x, _) in sets.items()
    }


def ours_with_peer_fit(name: str, train: tuple, sets: dict, num_classes: int) -> dict:
    """Our scoring with pytorch-ood's covariance estimate (Mahalanobis, relative)."""
    features, labels, logits = train
    stats = detectors.fit(name, features, labels, logits, num_classes)
    x = np.asarray(features, np.float64)
    centred = x - stats["means"][np.searchsorted(np.unique(labels), labels)]
    stats["precision"] = np.linalg.inv(centred.T @ centred + RIDGE * np.eye(x.shape[1]))
    if name == "relative_mahalanobis":
        background = x - stats["mean0"]
        stats["precision0"] = np.linalg.inv(background.T @ background + RIDGE * np.eye(x.shape[1]))
    return {n: detectors.score(name, stats, f, z) for n, (f, z) in sets.items()}


def ours(
    name: str, train: tuple, sets: dict, num_classes: int, settings: Settings,
    covariance: str = "pinv",
) -> dict:  # fmt: skip
    """Our detector `name` fitted on one member's `train`, scoring its `sets`."""
    stats = detectors.fit(name, *train, num_classes, settings.knn_k, settings.vim_dim, covariance)
    return {n: detectors.score(name, stats, f, z) for n, (f, z) in sets.items()}


def mean_auroc(scores: dict[str, np.ndarray]) -> float:
    """The mean over OOD sets of the member-mean score's AUROC (`scores`: set -> `[N, M]`)."""
    return float(np.mean([metrics.ood(scores["id"].mean(1), s.mean(1))["auroc"]
                          for n, s in scores.items() if n != "id"]))  # fmt: skip


def rows(predictions: Predictions, settings: Settings) -> list[dict[str, Any]]:
    train = predictions.train
    assert train is not None and train.features is not None, "the method saved no features"
    sets = {"id": predictions.id} | dict(predictions.ood)
    C = predictions.id.logits.shape[-1]
    M = train.features.shape[1]
    D = train.features.shape[-1]
    k, d = settings.knn_k, settings.vim_dim or D // 2
    out = []
    for name in DETECTORS:
        variants: dict[str, dict[str, list[np.ndarray]]] = {}
        for m in range(M):
            fit = (train.features[:, m], train.labels, train.logits[:, m])
            member = {n: (o.features[:, m], o.logits[:, m]) for n, o in sets.items()}
            half = {n: (f.astype(np.float16), z) for n, (f, z) in member.items()}
            fit16 = (fit[0].astype(np.float16), *fit[1:])

            scored = {
                "ours": ours(name, fit, member, C, settings),
                "peer": peer_scores(name, fit, member, C, k, d),
                "float16": ours(name, fit16, half, C, settings),
            }
            if name in ("mahalanobis", "relative_mahalanobis"):
                scored["ours_peer_fit"] = ours_with_peer_fit(name, fit, member, C)
                scored["ledoit_wolf"] = ours(name, fit, member, C, settings, "ledoit_wolf")
            for variant, by_set in scored.items():
                for n, s in by_set.items():
                    variants.setdefault(variant, {}).setdefault(n, []).append(np.asarray(s))
        auroc = {v: mean_auroc({n: np.stack(s, 1) for n, s in by.items()})
                 for v, by in variants.items()}  # fmt: skip
        out.append({"quantity": f"{name} AUROC", **auroc,
                    "difference": auroc["peer"] - auroc["ours"]})  # fmt: skip
    p = predictions.id.probs.astype(np.float64).mean(1)
    confidence, correct = p.max(-1), p.argmax(-1) == predictions.id.labels
    ours_areas = selective.selective(confidence, correct)
    peer = torch_uncertainty_areas(p, predictions.id.labels)
    for key in ("aurc", "augrc"):
        out.append({"quantity": key.upper(), "ours": ours_areas[key], "peer": peer[key],
                    "ours_peer_fit": ours_areas[f"{key}_tu"],
                    "difference": peer[key] - ours_areas[key]})  # fmt: skip
    return out


def torch_uncertainty_areas(probs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """torch-uncertainty 0.13's `AURC` and `AUGRC` (its module loaded alone: the package's
    `__init__` needs Lightning)."""
    import torch

    spec = importlib.util.find_spec("torch_uncertainty")
    assert spec is not None and spec.origin is not None, "torch-uncertainty is not installed"
    path = Path(spec.origin).parent / "metrics" / "classification" / "risk_coverage.py"
    module_spec = importlib.util.spec_from_file_location("tu_risk_coverage", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    out = {}
    for key, metric in (("aurc", module.AURC()), ("augrc", module.AUGRC())):
        metric.update(torch.as_tensor(probs), torch.as_tensor(labels))
        out[key] = float(metric.compute())
    return out


COLUMNS = [
    {"name": "quantity", "header": "quantity"},
    {"name": "ours", "header": "ours", "fmt": ".4f"},
    {"name": "peer", "header": "peer library", "fmt": ".4f"},
    {"name": "difference", "header": "peer - ours", "fmt": "+.1e"},
    {"name": "ours_peer_fit", "header": "ours, peer's convention", "fmt": ".4f"},
    {"name": "float16", "header": "ours, float16 features", "fmt": ".4f"},
    {"name": "ledoit_wolf", "header": "ours, Ledoit-Wolf", "fmt": ".4f"},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("method")
    parser.add_argument("--table", required=True)
    parser.add_argument("--cpu", required=True)
    parser.add_argument("--stub-torchvision", action="store_true")
    args = parser.parse_args()
    if args.stub_torchvision:
        stub_torchvision()
    results = json.loads((args.workdir / "results.json").read_text())
    from ml_collections import ConfigDict

    settings = Settings.of(ConfigDict(results["config"]))
    with np.load(args.workdir / "predictions" / f"{args.method}.npz") as npz:
        predictions = Predictions.from_arrays(dict(npz))
    table = rows(predictions, settings)
    for row in table:
        print({k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()})
    tables = json.loads(DATA.read_text()) if DATA.is_file() else {}
    tables[args.table] = {
        "cpu": args.cpu,
        "date": datetime.date.today().isoformat(),
        "source": f"`python scripts/peer_check.py {args.workdir} {args.method}` (pytorch-ood "
        "0.4.0, torch-uncertainty 0.13.0; the member-mean score's mean AUROC over the OOD sets, "
        "each member's detector fitted on its training-subset features)",
        "columns": COLUMNS,
        "rows": table,
    }
    from tables import dump  # scripts/ is on the path of a script run as written

    DATA.write_text(dump(tables))


if __name__ == "__main__":
    main()
