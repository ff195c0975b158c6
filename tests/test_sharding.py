"""Runs on a mesh of 8 CPU devices (conftest) equal runs on one device: prediction (single,
fused Hydra, stacked Deep Ensemble), head scores, circuit search and training, for data=8,
data=4 x member=2 and data=2 x heads=4; and the partition rules lay arrays out as they say."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from launch import run_processes

import hydra_jax as hj
from hydra_jax import hydra, testing
from hydra_jax.data import TokenizedSet, uncertainty_batches
from hydra_jax.ensembles import baselines
from hydra_jax.evaluation import Method, logits_forward, predict
from hydra_jax.heads import CircuitSearch, compact, his_and_entropy
from hydra_jax.models import BertConfig, with_classifier
from hydra_jax.models.sharding import (
    make_mesh,
    overlapped,
    param_shardings,
    path_string,
    place_params,
    to_host,
)
from hydra_jax.testing import assert_close
from hydra_jax.training import TrainSettings, fit

pytestmark = pytest.mark.slow  # studies end to end, meshes, several processes

L, N, K = 2, 8, 3  # 2 members keep 4 heads each: heads=4 divides both N and a member's heads
CONFIG = BertConfig(
    testing.encoder(layers=L, heads=N, head_dim=K, mlp_dim=20, dropout=0.1),
    vocab_size=31, max_positions=24, type_vocab_size=2,
)  # fmt: skip
# One process's meshes; the data=4 x member=2 mesh runs over two processes
# (test_two_processes_give_the_one_device_results), which checks everything these do.
MESHES = {"data=8": (8, 1, 1), "data=2 x heads=4": (2, 1, 4)}
COMPACT_KEEP = np.arange(L * N).reshape(L, N) % 3 != 1  # 5 or 6 heads per layer
# A small learning rate: Adam turns a gradient near its epsilon into a step of about lr either
# way, so rounding noise moves such weights by up to lr between device layouts.
SETTINGS = TrainSettings(epochs=1, batch_size=8, learning_rate=3e-4, warmup_fraction=0.0,
                         checkpoint_every=2, log_every=1)  # fmt: skip


def tokens(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    return [np.r_[1, rng.integers(3, 31, rng.integers(2, 11)), 2].astype(np.int32)
            for _ in range(n)]  # fmt: skip


@pytest.fixture(scope="module")
def setup():
    assert len(jax.devices()) == 8, "conftest asks for 8 CPU devices"
    return scenario()


def scenario():
    """The models and data every run compares (also built by tests/multiprocess_worker.py)."""
    rng = np.random.default_rng(0)
    members = [with_classifier(hj.Model.init(CONFIG, jax.random.key(m)), 3, jax.random.key(9))
               for m in range(2)]  # fmt: skip
    single = members[0]
    keep = np.zeros((2, L, N), bool)
    keep[0, :, :4], keep[1, :, 4:] = True, True
    fused = hydra.fuse(hydra.members_from(single, keep))
    methods = [
        Method("single", baselines.single(single), single.params),
        Method("hydra", logits_forward(fused), fused.params),
        Method("deep_ensemble", baselines.deep_ensemble(single), baselines.stack(members), True),
    ]
    test = TokenizedSet(tokens(rng, 21), rng.integers(0, 3, 21))
    train = TokenizedSet(tokens(rng, 32), rng.integers(0, 3, 32))
    search = uncertainty_batches(TokenizedSet(tokens(rng, 12), rng.integers(0, 3, 12)),
                                 TokenizedSet(tokens(rng, 12), np.zeros(12, int)), 8)  # fmt: skip
    return single, methods, test, train, search


def run_all(setup, workdir, interrupted: bool = False):
    """Prediction, head scores, circuit search and training (`interrupted`: stopped after 2
    steps, then resumed from its checkpoint), as host arrays."""
    single, methods, test, train, search = setup
    calibration = [train.batch(np.arange(i, i + 8)) for i in (0, 8)]
    if interrupted:
        fit(single, train, SETTINGS, workdir, stop_after=2)
    return {
        "predict": {m.name: predict(m, test, 8, progress=False) for m in methods},
        "scores": his_and_entropy(single, calibration),
        "circuit": CircuitSearch(single)(search, keep_per_layer=3, objective="avg"),
        "fit": jax.tree.map(to_host, fit(single, train, SETTINGS, workdir).params),
    }


def assert_same_results(got, want):
    """Sharded programs split and order their reductions differently from one device's: floats
    agree to float32 rounding (`assert_close`). The circuit is a discrete choice: equal unless two
    candidates' objectives tie to within that rounding."""
    for name, logits in want["predict"].items():
        assert_close(got["predict"][name], logits, err_msg=name)
    for a, b in zip(got["scores"], want["scores"], strict=True):
        assert_close(a, b)
    np.testing.assert_array_equal(got["circuit"], want["circuit"])
    testing.assert_trained_params_close(got["fit"], want["fit"])


@pytest.fixture(scope="module")
def one_device(setup, tmp_path_factory):
    return run_all(setup, tmp_path_factory.mktemp("one"))


@pytest.mark.parametrize("mesh", MESHES)
def test_a_mesh_gives_the_one_device_results(setup, one_device, mesh, tmp_path):
    with jax.set_mesh(make_mesh(*MESHES[mesh])):
        got = run_all(setup, tmp_path)
    assert_same_results(got, one_device)


@pytest.mark.processes
def test_two_processes_give_the_one_device_results(setup, one_device, tmp_path):
    """2 processes x 4 CPU devices (jax.distributed, gloo), one global data=4 x member=2 mesh:
    every check of the one-device run in one launch (a launch costs seconds). Training stops
    after 2 steps and resumes from the checkpoint both processes saved; each process loads
    only its half of every training batch; `compact` gathers weights sharded over processes."""
    results = launch_workers(tmp_path)
    got = {
        "predict": {
            k[len("predict/") :]: v for k, v in results.items() if k.startswith("predict/")
        },
        "scores": (results["his"], results["entropy"]),
        "circuit": results["circuit"],
        "fit": jax.tree_util.tree_unflatten(
            jax.tree_util.tree_structure(one_device["fit"]),
            [results[f"fit/{i}"] for i in range(len(jax.tree.leaves(one_device["fit"])))],
        ),
    }
    assert_same_results(got, one_device)
    # `compact` of weights whose heads are split over both processes equals it on host weights.
    want = compact(setup[0], COMPACT_KEEP).params
    for i, leaf in enumerate(jax.tree.leaves(want)):  # a gather, no arithmetic: exactly equal
        np.testing.assert_array_equal(results[f"compact/{i}"], leaf)
    # Only process 0 wrote the training log: one line per step, none twice.
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert steps == sorted(set(steps))


def launch_workers(tmp_path: Path) -> dict[str, np.ndarray]:
    """Runs tests/multiprocess_worker.py as processes 0 and 1; their results (process 0's)."""
    worker = Path(__file__).parent / "multiprocess_worker.py"
    run_processes([sys.executable, str(worker), "{process_id}", "{port}", str(tmp_path)])
    with np.load(tmp_path / "results.npz") as npz:
        return dict(npz)


def test_training_state_is_laid_out_by_the_rules(setup, tmp_path):
    single, _, _, train, _ = setup
    mesh = make_mesh(2, 1, 4)
    with jax.set_mesh(mesh):
        params = fit(single, train, SETTINGS, tmp_path).params
    query = params["encoder"]["layer_0"]["attention"]["query"]["kernel"]  # [D, N, K]
    assert query.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "heads", None)), 3)
    assert len(query.addressable_shards) == 8 and query.addressable_shards[0].data.shape[1] == 2
    fc1 = params["encoder"]["layer_0"]["mlp"]["fc1"]["kernel"]
    assert fc1.sharding.is_fully_replicated  # MLPs are replicated


def test_partition_rules():
    mesh = make_mesh(2, 2, 2)
    fused = {"shared": {"encoder": {"layer_0": {"mlp": {"fc1": {"kernel": np.zeros((4, 6))}}}}},
             "members": {"encoder": {"layer_0": {"attention": {
                 "query": {"kernel": np.zeros((2, 4, 2, 3)), "bias": np.zeros((2, 2, 3))},
                 "out": {"kernel": np.zeros((2, 2, 3, 4))}}}}}}  # fmt: skip
    specs = jax.tree.map(lambda s: s.spec, param_shardings(fused, mesh))
    attention = specs["members"]["encoder"]["layer_0"]["attention"]
    assert attention["query"]["kernel"] == P("member", None, "heads", None)
    assert attention["query"]["bias"] == P("member", "heads", None)
    assert attention["out"]["kernel"] == P("member", "heads", None, None)
    assert specs["shared"]["encoder"]["layer_0"]["mlp"]["fc1"]["kernel"] == P(None, None)
    # A dimension the mesh does not divide is replicated: 3 heads on heads=2, 3 members.
    odd = {"attention": {"query": {"kernel": np.zeros((3, 4, 3, 3))}}}
    assert param_shardings(odd, mesh, stacked=True)["attention"]["query"]["kernel"].spec == P(
        None, None, None, None
    )


def test_mesh_sizes_are_checked(monkeypatch):
    with pytest.raises(ValueError, match="needs 16 devices; 8 available"):
        make_mesh(data=4, member=4)
    for size in (0, 2.0, True):
        with pytest.raises(ValueError, match="positive integers"):
            make_mesh(data=size)
    assert make_mesh(data=4).size == 4  # one process: a mesh over some devices is fine
    assert make_mesh(data=np.int64(2), heads=np.int32(2)).shape == {"data": 2, "member": 1,
                                                                   "heads": 2}  # fmt: skip
    # With several processes (as tests/multiprocess_worker.py checks on 2 real ones), a mesh
    # that leaves devices, and so processes, out is refused before any work.
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ValueError, match=r"spans 4 devices, but 2 processes hold 8: .* all"):
        make_mesh(data=4)
    assert make_mesh(data=4, member=2).size == 8


def test_without_a_mesh_nothing_is_moved():
    params = {"attention": {"query": {"kernel": np.zeros((4, 2, 3))}}}
    assert place_params(params) is params


def test_overlapped_reads_each_result_back_after_dispatching_the_next():
    dispatched = []

    def dispatch(i: int) -> dict[str, jax.Array]:
        dispatched.append(i)
        return {"x": jax.numpy.full((2,), i)}

    seen = []
    for i, result in overlapped(range(4), dispatch):
        assert dispatched == list(range(min(i + 2, 4)))  # the next one is already on its way
        assert isinstance(result["x"], np.ndarray)
        np.testing.assert_array_equal(result["x"], [i, i])
        seen.append(i)
    assert seen == [0, 1, 2, 3]
    assert list(overlapped([], dispatch)) == []


def test_new_families_lay_out_their_heads_and_predict_as_on_one_device():
    """DeBERTa (its own position projections are per-head `[D, N, K]` too) and ModernBERT
    (rotary, a local layer, GeGLU) on a data=2 x heads=4 mesh: every per-head projection is
    split over `heads`, and the logits equal the one-device logits."""
    from hydra_jax.models import ModernBertConfig, RelativeAttention

    e = CONFIG.encoder
    relative = RelativeAttention(span=4, buckets=4, max_distance=24, share_keys=False)
    deberta = BertConfig(
        dataclasses.replace(e, relative=relative), vocab_size=31, max_positions=24,
        type_vocab_size=0, pooler=False, num_labels=3, model_type="deberta-v2",
        absolute_positions=False,
    )  # fmt: skip
    modern = ModernBertConfig(
        dataclasses.replace(e, head_dim=4, width=N * 4, pre_norm=True, gated_mlp=True,
                            rotary=(1e4, 1e3), windows=(0, 3), first_norm=False,
                            qkv_bias=False, out_bias=False, mlp_bias=False, norm_bias=False),
        vocab_size=31, max_positions=24, num_labels=3, pooling="mean",
    )  # fmt: skip
    rng = np.random.default_rng(2)
    ids = rng.integers(3, 31, (8, 9)).astype(np.int32)
    mask = (np.arange(9)[None] < rng.integers(3, 10, (8, 1))).astype(np.int32)
    for config in (deberta, modern):
        model = hj.Model.init(config, jax.random.key(3))
        want = model(input_ids=ids, attention_mask=mask).logits
        with jax.set_mesh(make_mesh(2, 1, 4)):
            params = place_params(model.params)
            forward = jax.jit(lambda p, m=model: m.apply(p, input_ids=ids, attention_mask=mask))
            got = forward(params).logits
        layer = params["encoder"]["layer_0"]["attention"]
        names = ("pos_key", "pos_query", "query") if config is deberta else ("query", "value")
        for name in names:
            assert layer[name]["kernel"].sharding.spec == P(None, "heads", None), name
        assert_close(got, want, err_msg=type(config).__name__)


def test_efficient_ensembles_split_their_members_and_predict_as_on_one_device():
    """A BatchEnsemble and a LoRA-Ensemble of 2 members on data=2 x member=2 x heads=2: every
    leaf under `members` is split over `member`, the shared q/k/v kernels over `heads`, and the
    member logits equal the one-device logits."""
    model = with_classifier(hj.Model.init(CONFIG, jax.random.key(4)), 3, jax.random.key(5))
    rng = np.random.default_rng(3)
    ids = rng.integers(3, 31, (8, 9)).astype(np.int32)
    mask = (np.arange(9)[None] < rng.integers(3, 10, (8, 1))).astype(np.int32)
    key = jax.random.key(6)
    for ensemble in (hydra.batch_ensemble(model, 2, key), hydra.lora_ensemble(model, 2, key, 2)):
        adapters = ensemble.params["members"]["adapters"]  # LoRA's b: nonzero, to compare
        members = {**ensemble.params["members"], "adapters": jax.tree.map(lambda x: x + 0.3,
                                                                          adapters)}  # fmt: skip
        ensemble = hj.Model(ensemble.config, {**ensemble.params, "members": members})
        want = ensemble(input_ids=ids, attention_mask=mask).logits
        with jax.set_mesh(make_mesh(2, 2, 2)):
            params = place_params(ensemble.params)
            forward = jax.jit(lambda p, e=ensemble: e.apply(p, input_ids=ids, attention_mask=mask))
            got = forward(params).logits
        for path, leaf in jax.tree_util.tree_leaves_with_path(params["members"]):
            assert leaf.sharding.spec[0] == "member", path_string(path)
        query = params["shared"]["encoder"]["layer_0"]["attention"]["query"]["kernel"]
        assert query.sharding.spec == P(None, "heads", None)
        assert_close(got, want, err_msg=type(ensemble.config).__name__)


def test_mimo_shards_as_its_network_and_predicts_as_on_one_device():
    """MIMO's weights are one ViT's (no member axis): on data=2 x heads=2 its attention kernels
    split over `heads`, and the member logits equal the one-device logits."""
    vit = testing.vit(layers=1, heads=2, head_dim=3, mlp_dim=7, num_channels=2, num_labels=3)
    mimo = hydra.mimo(vit, 2, jax.random.key(7))
    images = np.random.default_rng(4).normal(size=(4, 2, 8, 8)).astype(np.float32)
    want = mimo(pixel_values=images).logits
    with jax.set_mesh(make_mesh(data=2, heads=2)):
        params = place_params(mimo.params)
        got = jax.jit(lambda p: mimo.apply(p, pixel_values=images).logits)(params)
    query = params["encoder"]["layer_0"]["attention"]["query"]["kernel"]
    assert query.sharding.spec == P(None, "heads", None)
    assert got.shape == (4, 2, 3)
    assert_close(got, want)
