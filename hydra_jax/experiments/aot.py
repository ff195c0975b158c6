"""A study's programs compiled without running them (`hydra-jax plan`): per-device work, memory
and a roofline time on a mesh of CPU devices or of a TPU topology, from a CPU.

Weights are abstract (`jax.eval_shape`): nothing is downloaded or materialised. A config names
its model by `architecture` (family and sizes, `plan_architecture`), the methods to plan
(`plan.methods`), the member count and the heads each Hydra member keeps, the batch sizes of
prediction and training, the compute dtype and whether training rematerialises each layer
(`plan.remat`). Each method's programs are compiled for the
target's devices under its mesh, and once for one CPU device: the work split is the per-device
FLOPs times the device count over the one-device FLOPs (1.00: the work divides evenly). TPU
targets (`v5e:2x4`, `v4:2x2x2`, `v5p:2x2x2`, `v6e:2x4`, ...) compile through libtpu
(`pip install "hydra_jax[tpu]"`), which needs no TPU.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from jax.experimental import topologies
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from hydra_jax import hydra, testing
from hydra_jax.ensembles import baselines
from hydra_jax.models import HydraConfig, Model, with_dtype, with_remat
from hydra_jax.models.architectures import input_names
from hydra_jax.models.sharding import AXES, abstract_params, make_mesh, rows_sharding
from hydra_jax.training import TrainSettings, TrainState, make_optimizer, make_train_step

# Published per-chip figures (Google Cloud TPU documentation, "TPU versions"): dense bf16 peak
# FLOP/s, HBM bytes and HBM bandwidth in bytes/s.
CHIPS: dict[str, tuple[float, float, float]] = {
    "v4": (275e12, 32e9, 1228e9),
    "v5e": (197e12, 16e9, 819e9),
    "v5p": (459e12, 95e9, 2765e9),
    "v6e": (918e12, 32e9, 1640e9),
}
PROGRAMS = ("predict", "train_step")


@dataclasses.dataclass(frozen=True)
class Row:
    """One method's program on the target: per-device figures (bytes are XLA's estimates)."""

    method: str
    program: str
    flops_per_device: float
    bytes_per_device: float
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    fits: bool | None  # None: a CPU target (no memory limit to check)
    hbm_bytes: float | None
    roofline_ms: float | None
    work_split: float


def target_devices(target: str) -> tuple[list[Any], str | None]:
    """The devices of `target` (`cpu:N` or a TPU topology name) and its chip (None for CPUs).

    Raises:
      ValueError: a target of neither form, too few CPU devices, an unknown chip, or no libtpu.
    """
    kind, _, size = target.partition(":")
    if kind == "cpu":
        if not size.isdigit() or int(size) < 1:
            raise ValueError(f"target {target!r}: give cpu:N with N devices, e.g. cpu:8")
        devices = jax.devices("cpu")
        if len(devices) < int(size):
            raise ValueError(
                f"target {target!r} needs {size} CPU devices, this process has {len(devices)}: "
                f"set JAX_NUM_CPU_DEVICES={size} before JAX starts (`hydra-jax plan` does)"
            )
        return devices[: int(size)], None
    if kind not in CHIPS or not size:
        raise ValueError(
            f"target {target!r}: give cpu:N or a TPU topology CHIP:SHAPE with CHIP one of "
            f"{sorted(CHIPS)}, e.g. v5e:2x4"
        )
    if importlib.util.find_spec("libtpu") is None:
        raise ValueError(
            f"target {target!r} compiles through libtpu, which is not installed: "
            'pip install "hydra_jax[tpu]" (no TPU needed)'
        )
    # Quiets libtpu's start-up on a machine that is no TPU host (it looks for its workers), and
    # lets several processes compile at once: the lock file libtpu takes guards TPU devices,
    # which a compilation for a topology never touches.
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    topology = topologies.get_topology_desc(platform="tpu", topology_name=target)
    return list(topology.devices), kind


def target_mesh(devices: list[Any], data: int, member: int, heads: int) -> Mesh:
    """A `data x member x heads` mesh over every device of the target."""
    if data * member * heads != len(devices):
        raise ValueError(
            f"mesh data={data} x member={member} x heads={heads} has {data * member * heads} "
            f"places, the target {len(devices)} devices: give sizes multiplying to {len(devices)}"
        )
    return make_mesh(data, member, heads, devices)


def plan_architecture(spec: ml_collections.ConfigDict) -> Any:
    """A model config from `architecture`: `family` (`vit` or `bert`) and the sizes
    `hydra_jax.testing.vit` / `bert` take (layers, heads, head_dim, mlp_dim, ...)."""
    fields = dict(spec)
    family = fields.pop("family")
    builders = {"vit": testing.vit, "bert": testing.bert}
    if family not in builders:
        raise ValueError(f"architecture.family: {family!r}; known: {sorted(builders)}")
    return builders[family](**fields)


def _abstract(build: Callable[[jax.Array], Model]) -> Model:
    """`build(key)`'s model with weight shapes only (`jax.eval_shape`)."""
    configs = []

    def params(key: jax.Array) -> Any:
        model = build(key)
        configs.append(model.config)
        return model.params

    shapes = jax.eval_shape(params, jax.random.key(0))
    return Model(configs[0], shapes)


def methods(config: ml_collections.ConfigDict) -> dict[str, tuple[Model, bool]]:
    """Each planned method as `(abstract model, stacked)`: `single`, `deep_ensemble` (stacked
    members), `hydra` (M members keeping `plan.member_heads` heads per layer), `batch_ensemble`,
    `lora_ensemble`."""
    arch = plan_architecture(config.architecture)
    M, heads = config.plan.num_members, config.plan.member_heads
    member = dataclasses.replace(
        arch,
        encoder=dataclasses.replace(arch.encoder, num_heads=(heads,) * arch.encoder.num_layers),
    )
    builders: dict[str, tuple[Callable[[jax.Array], Model], bool]] = {
        "single": (lambda k: Model.init(arch, k), False),
        "deep_ensemble": (lambda k: Model.init(arch, k), True),
        "hydra": (lambda k: Model.init(HydraConfig(member, M), k), False),
        "batch_ensemble": (lambda k: hydra.batch_ensemble(Model.init(arch, k), M, k), False),
        "lora_ensemble": (lambda k: hydra.lora_ensemble(Model.init(arch, k), M, k, 8), False),
    }
    names = [n.strip() for n in config.plan.methods.split(",") if n.strip()]
    unknown = sorted(set(names) - set(builders))
    if unknown:
        raise ValueError(f"plan.methods: unknown {unknown}; known: {', '.join(builders)}")
    dtype = config.plan.dtype
    out = {}
    for name in names:
        build, stacked = builders[name]
        model = _abstract(build)
        out[name] = (with_dtype(model, dtype) if dtype != "float32" else model, stacked)
    return out


def _inputs(model: Model, batch: int, config: ml_collections.ConfigDict, mesh: Mesh | None):
    rows = None if mesh is None else NamedSharding(mesh, P("data"))
    arch = config.architecture
    if "pixel_values" in input_names(model.config):
        shape = (batch, arch.get("num_channels", 3), arch.image_size, arch.image_size)
        inputs = {"pixel_values": jax.ShapeDtypeStruct(shape, jnp.float32, sharding=rows)}
    else:
        tokens = (batch, config.plan.tokens)
        inputs = {
            name: jax.ShapeDtypeStruct(tokens, jnp.int32, sharding=rows)
            for name in ("input_ids", "attention_mask")
        }
    return inputs, jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=rows)


def compiled_programs(
    model: Model, stacked: bool, config: ml_collections.ConfigDict, mesh: Mesh | None
) -> dict[str, Any]:
    """`predict` (the member logits of a prediction batch, split by rows as `predict` declares
    them) and, but for a stacked Deep Ensemble (whose members train one by one, as `single`),
    `train_step` (one AdamW step of a training batch; each layer rematerialised with
    `plan.remat`), compiled for `mesh` (None: one CPU device)."""
    M = config.plan.num_members
    out = {}
    inputs, labels = _inputs(model, config.plan.predict_batch, config, mesh)
    rows = rows_sharding(config.plan.predict_batch)
    if stacked:
        stacked_params = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct((M, *a.shape), a.dtype), model.params
        )
        forward = jax.jit(baselines.deep_ensemble(model), out_shardings=rows)
        out["predict"] = forward.lower(
            abstract_params(stacked_params, mesh, True), inputs
        ).compile()
        return out
    forward = jax.jit(lambda p, x: model.apply(p, **x).logits, out_shardings=rows)
    out["predict"] = forward.lower(abstract_params(model.params, mesh), inputs).compile()
    inputs, labels = _inputs(model, config.plan.train_batch, config, mesh)
    optimizer = make_optimizer(TrainSettings(), 1000)
    step = make_train_step(with_remat(model, config.plan.remat), optimizer)
    state = jax.eval_shape(lambda p: TrainState.create(p, optimizer), model.params)
    key = jax.eval_shape(lambda: jax.random.key(0))  # no computation: the mesh may be a TPU
    batch = inputs | {"labels": labels}
    out["train_step"] = step.single.lower(abstract_params(state, mesh), batch, key).compile()
    return out


def _cost(compiled: Any) -> dict[str, float]:
    analysis = compiled.cost_analysis()
    return analysis[0] if isinstance(analysis, list) else analysis


def plan(
    config: ml_collections.ConfigDict, target: str, mesh_sizes: dict[str, int] | None = None
) -> dict[str, Any]:
    """Every planned method's programs compiled for `target` on a mesh of `mesh_sizes` (default:
    every device on `data`): `{"target", "devices", "mesh", "rows": [Row as dict]}`."""
    devices, chip = target_devices(target)
    sizes = {"data": len(devices), "member": 1, "heads": 1} | dict(mesh_sizes or {})
    unknown = sorted(set(sizes) - set(AXES))
    if unknown:
        raise ValueError(f"mesh axes {unknown}; the axes are {', '.join(AXES)}")
    if mesh_sizes and "data" not in mesh_sizes:
        sizes["data"] = len(devices) // (sizes["member"] * sizes["heads"])
    mesh = target_mesh(devices, sizes["data"], sizes["member"], sizes["heads"])
    rows = []
    for name, (model, stacked) in methods(config).items():
        one = {
            k: _cost(c)["flops"] for k, c in compiled_programs(model, stacked, config, None).items()
        }
        with jax.set_mesh(mesh):
            programs = compiled_programs(model, stacked, config, mesh)
        for program, compiled in programs.items():
            cost, memory = _cost(compiled), compiled.memory_analysis()
            flops, moved = cost.get("flops", 0.0), cost.get("bytes accessed", 0.0)
            args, outs = memory.argument_size_in_bytes, memory.output_size_in_bytes
            temp = memory.temp_size_in_bytes
            peak, hbm, bandwidth = CHIPS[chip] if chip else (None, None, None)
            rows.append(Row(
                name, program, flops, moved, args, outs, temp,
                None if hbm is None else bool(args + outs + temp <= hbm), hbm,
                None if peak is None else 1e3 * max(flops / peak, moved / bandwidth),
                flops * len(devices) / one[program],
            ))  # fmt: skip
    return {
        "target": target,
        "devices": len(devices),
        "mesh": sizes,
        "rows": [dataclasses.asdict(r) for r in rows],
    }


def table(result: dict[str, Any]) -> str:
    """`plan`'s result as a Markdown table."""
    lines = [
        f"{result['target']}: {result['devices']} devices, mesh "
        + " x ".join(f"{k}={v}" for k, v in result["mesh"].items()),
        "",
        "| method | program | GFLOP / device | GB moved / device | arguments GB | temporaries GB "
        "| fits | roofline ms | work split |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        fits = "-" if r["fits"] is None else ("yes" if r["fits"] else "no")
        roofline = "-" if r["roofline_ms"] is None else f"{r['roofline_ms']:.2f}"
        lines.append(
            f"| {r['method']} | {r['program']} | {r['flops_per_device'] / 1e9:,.1f} "
            f"| {r['bytes_per_device'] / 1e9:,.2f} | {r['argument_bytes'] / 1e9:.2f} "
            f"| {r['temp_bytes'] / 1e9:.2f} | {fits} | {roofline} | {r['work_split']:.2f} |"
        )
    return "\n".join(lines)


def load_config(spec: str) -> ml_collections.ConfigDict:
    """The config `FILE[:ARG]` names: its `get_config(ARG)`."""
    path, _, arg = spec.partition(":")
    module_spec = importlib.util.spec_from_file_location("plan_config", path)
    if not os.path.isfile(path) or module_spec is None or module_spec.loader is None:
        raise ValueError(f"--config {spec!r}: no config file at {path}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg)


def mesh_argument(text: str) -> dict[str, int]:
    """`data=4,member=2` as sizes."""
    sizes = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        name, sep, value = entry.partition("=")
        if not sep or not value.isdigit():
            raise ValueError(f"--mesh {text!r}: give AXIS=SIZE,... with AXIS in {', '.join(AXES)}")
        sizes[name] = int(value)
    return sizes


def main(argv: list[str]) -> int:
    """`hydra-jax plan --config FILE[:ARG] --target cpu:N|TOPOLOGY [--mesh data=4,member=2]
    [--json FILE]`: the table on stdout, the rows as JSON in FILE."""
    parser = argparse.ArgumentParser(prog="hydra-jax plan", description=main.__doc__)
    parser.add_argument("--config", required=True, help="a config file, FILE[:ARG]")
    parser.add_argument("--target", required=True, help="cpu:N or a TPU topology, e.g. v5e:2x4")
    parser.add_argument("--mesh", default="", help="mesh axis sizes, e.g. data=4,member=2")
    parser.add_argument("--json", default=None, help="write the rows to this file")
    args = parser.parse_args(argv)
    try:
        kind, _, size = args.target.partition(":")
        if kind == "cpu" and size.isdigit():
            # Before the backend starts; after, `target_devices` says what is missing.
            with contextlib.suppress(RuntimeError):
                jax.config.update("jax_num_cpu_devices", int(size))
        result = plan(load_config(args.config), args.target, mesh_argument(args.mesh))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(table(result))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(result, file, indent=1)
    return 0
