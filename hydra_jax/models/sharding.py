"""Where weights and batches live on a device mesh: one table of partition rules.

Mesh axes (`AXES`):
  `data`    the batch axis of every input;
  `member`  the stacked member axis M of a fused Hydra's `members` weights, and of a Deep
            Ensemble's stacked weights;
  `heads`   the head axis N of the q/k/v kernels `[D, N, K]`, their biases `[N, K]` and the
            output kernel `[N, K, D]`: tensor parallelism that falls out of our layout (each
            device holds whole heads; the output projection's sum over heads becomes one
            all-reduce).
Everything else (embeddings, MLPs, LayerNorms, heads) is replicated. A dimension that its mesh
axis does not divide (a pruned layer of 3 heads on `heads=2`, a last batch of 5 rows on
`data=4`) is replicated instead, so the mesh never changes a result.

The rest of the package is sharding-agnostic: `jax.jit` propagates input shardings (GSPMD). The
entry points that feed compiled programs (training, prediction, head scoring, circuit search)
place their weights with `place_params` and each batch with `place_batch`, and bring results to
the host with `to_host` (the edge: metrics), one batch behind the device (`overlapped`); these
do nothing special when no mesh is set, so on one device nothing changes. With several
processes (`jax.distributed`), every process holds the same host data and each places the
shards its own devices hold, so a global mesh spans hosts unchanged. To run under a mesh:

    with jax.set_mesh(make_mesh(data=4, member=2)):
        model = fit(model, train, settings, workdir)
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from hydra_jax import checks

AXES = ("data", "member", "heads")
Item = TypeVar("Item")

# Parameter path (keys joined by "/", matched at the end) -> axes of its trailing dimensions.
# Leaves under a fused Hydra's `members`, and every leaf of a stacked Deep Ensemble, also have a
# leading `member` axis. Optimiser states (Adam's moments) mirror their parameters' paths.
RULES: tuple[tuple[re.Pattern[str], tuple[str | None, ...]], ...] = (
    (re.compile(r"attention/(pos_)?(query|key|value)/kernel$"), (None, "heads", None)),  # [D, N, K]
    (re.compile(r"attention/(pos_)?(query|key|value)/bias$"), ("heads", None)),  # [N, K]
    (re.compile(r"attention/out/kernel$"), ("heads", None, None)),  # [N, K, D]
)
MEMBERS = re.compile(r"(^|/)members/")

# Logical axes of activations -> the mesh axes each may be split over, in order (the Flax /
# MaxText convention): the models name their activations' axes (`constrain`) and this one table
# maps them, so every program divides its work over the mesh without relying on XLA's
# propagation. An array's `member` and `heads` axes claim their mesh axes first; `batch` takes
# `data` and, where nothing else of the array holds it, `member`: a model with no member axis (a
# single model, MC dropout, MIMO) on a mesh whose `member` axis is above 1 splits its batch over
# both instead of repeating the same work on every member row of devices.
LOGICAL_AXES: dict[str, tuple[str, ...]] = {
    "member": ("member",),
    "heads": ("heads",),
    "batch": ("data", "member"),
}
# Set while `member_vmap` traces its function: the mapped axis holds the mesh's `member` axis.
_MEMBER_MAPPED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "member_mapped", default=False
)


def make_mesh(
    data: int = 1, member: int = 1, heads: int = 1, devices: Sequence[jax.Device] | None = None
) -> Mesh:
    """A `data x member x heads` mesh (JAX's Auto sharding) over the first devices.

    With several processes the mesh must take every one of `devices` (by default every device
    of every process): a smaller one would leave processes out of the computation.

    Raises:
      ValueError: a size below 1, more devices asked for than there are, or, with several
        processes, fewer.
    """
    sizes = {"data": data, "member": member, "heads": heads}
    bad = {k: v for k, v in sizes.items() if not checks.is_count(v)}
    if bad:
        raise ValueError(f"mesh axis sizes must be positive integers, got {bad}")
    data, member, heads = (int(v) for v in sizes.values())  # NumPy integers too
    devices = list(jax.devices() if devices is None else devices)
    needed = data * member * heads
    if needed > len(devices):
        raise ValueError(
            f"mesh data={data} x member={member} x heads={heads} needs {needed} devices; "
            f"{len(devices)} available ({devices[0].platform})"
        )
    if jax.process_count() > 1 and needed != len(devices):
        raise ValueError(
            f"mesh data={data} x member={member} x heads={heads} spans {needed} devices, but "
            f"{jax.process_count()} processes hold {len(devices)}: with several processes the "
            f"mesh must span all of them (axis sizes multiplying to {len(devices)}; in a study, "
            f"config.mesh)"
        )
    grid = np.array(devices[:needed]).reshape(data, member, heads)
    return Mesh(grid, AXES, axis_types=(AxisType.Auto,) * len(AXES))


def path_string(path: tuple[Any, ...]) -> str:
    """`"encoder/layer_0/attention/query/kernel"` from a `jax.tree_util` key path."""
    names = []
    for key in path:
        for attribute in ("key", "name", "idx"):
            if hasattr(key, attribute):
                names.append(str(getattr(key, attribute)))
                break
    return "/".join(names)


def _fit(axes: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh) -> P:
    """`axes` as a spec of `shape`, each axis dropped where the mesh does not divide its dim."""
    pairs = zip(axes, shape, strict=True)
    return P(*(a if a is None or d % mesh.shape[a] == 0 else None for a, d in pairs))


def param_spec(path: str, shape: tuple[int, ...], mesh: Mesh, stacked: bool = False) -> P:
    """The spec of the weight at `path` (`stacked`: every leaf has a leading member axis)."""
    lead = ("member",) if stacked or MEMBERS.search(path) else ()
    rule = next((axes for pattern, axes in RULES if pattern.search(path)), ())
    if len(shape) < len(lead) + len(rule):  # not the layout the rule describes
        rule = ()
    axes = lead + (None,) * (len(shape) - len(lead) - len(rule)) + rule
    return _fit(axes, shape, mesh)


def abstract_params(tree: Any, mesh: Mesh | None = None, stacked: bool = False) -> Any:
    """`jax.ShapeDtypeStruct`s of `tree`'s leaves, on `mesh` laid out by `param_shardings`: what
    `jax.jit(f).lower` takes to compile for weights that need not exist."""
    if mesh is None:
        return jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), tree)
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(np.shape(a), a.dtype, sharding=s),
        tree,
        param_shardings(tree, mesh, stacked),
    )


def param_specs(tree: Any, mesh: Any, stacked: bool = False) -> Any:
    """The `PartitionSpec` of every leaf of a weight (or train state) tree (`param_spec`) on a
    mesh, concrete or abstract."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: param_spec(path_string(path), np.shape(x), mesh, stacked), tree
    )


def param_shardings(tree: Any, mesh: Mesh, stacked: bool = False) -> Any:
    """`NamedSharding`s for every leaf of a weight (or train state) tree."""
    return jax.tree.map(
        lambda spec: NamedSharding(mesh, spec),
        param_specs(tree, mesh, stacked),
        is_leaf=lambda x: isinstance(x, P),
    )


def batch_shardings(batch: Any, mesh: Mesh) -> Any:
    """Every input split along its leading (batch) axis over `data`."""

    def sharding(x: Any) -> NamedSharding:
        return NamedSharding(mesh, _fit(("data",) + (None,) * (np.ndim(x) - 1), np.shape(x), mesh))

    return jax.tree.map(sharding, batch)


def current_mesh() -> Mesh | None:
    """The mesh set by `jax.set_mesh`, or None (outside `jax.jit`)."""
    mesh = jax.sharding.get_mesh()
    return None if mesh.empty else mesh


def traced_mesh() -> Any:
    """The (abstract) mesh set by `jax.set_mesh`, or None: inside `jax.jit` too."""
    mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty else mesh


def _put(tree: Any, shardings: Any) -> Any:
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)

    def put(x: Any, sharding: NamedSharding) -> jax.Array:  # this process's shards only
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(put, tree, shardings)


def place_params(tree: Any, stacked: bool = False) -> Any:
    """`tree` laid out by `RULES` on the current mesh; unchanged when none is set."""
    mesh = current_mesh()
    return tree if mesh is None else _put(tree, param_shardings(tree, mesh, stacked))


def place_batch(batch: Any) -> Any:
    """`batch` split over `data` on the current mesh; unchanged when none is set."""
    mesh = current_mesh()
    return batch if mesh is None else _put(batch, batch_shardings(batch, mesh))


def logical_spec(axes: Sequence[str | None], shape: Sequence[int], mesh: Any) -> P:
    """The spec of an activation whose axes are named `axes` (`LOGICAL_AXES`; None: never
    split): each named axis takes its mesh axes that are above 1, not yet taken by another
    axis of the array, and divide its size together."""
    taken = {"member"} if _MEMBER_MAPPED.get() else set()
    spec: list[Any] = [None] * len(axes)
    names = list(LOGICAL_AXES)
    order = sorted(
        (i for i, a in enumerate(axes) if a is not None), key=lambda i: names.index(axes[i])
    )
    for i in order:
        chosen, size = [], 1
        for mesh_axis in LOGICAL_AXES[axes[i]]:  # type: ignore[index]
            n = mesh.shape[mesh_axis]
            if mesh_axis in taken or n == 1 or shape[i] % (size * n):
                continue
            chosen.append(mesh_axis)
            size *= n
        taken.update(chosen)
        spec[i] = tuple(chosen) if len(chosen) > 1 else (chosen[0] if chosen else None)
    return P(*spec)


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
    """`x` laid out on the current mesh by its logical `axes` (`logical_spec`); unchanged when
    no mesh of several devices is set, so a one-device program is the same program."""
    mesh = traced_mesh()
    if mesh is None or mesh.size == 1:
        return x
    if len(axes) != x.ndim:
        raise ValueError(f"{len(axes)} logical axes {tuple(axes)} for an array of shape {x.shape}")
    spec = logical_spec(axes, x.shape, mesh)
    return jax.lax.with_sharding_constraint(x, spec)  # on the mesh `jax.set_mesh` set


def constrain_params(tree: Any, stacked: bool = False) -> Any:
    """A weight (or train state) tree laid out by `RULES` on the current (traced) mesh, as
    `param_shardings` places it: a jitted step's declared output layout, so the state it returns
    is the state it takes. Unchanged when no mesh of several devices is set."""
    mesh = traced_mesh()
    if mesh is None or mesh.size == 1:
        return tree
    return jax.lax.with_sharding_constraint(tree, param_specs(tree, mesh, stacked))


def rows_out(f: Callable[..., Any]) -> Callable[..., Any]:
    """`f` with every output's leading axis declared a batch axis (`constrain`): a jitted
    program's output layout, split over the mesh as its input rows are."""

    def constrained(*args: Any, **kwargs: Any) -> Any:
        return jax.tree.map(
            lambda y: constrain(y, ("batch",) + (None,) * (y.ndim - 1)), f(*args, **kwargs)
        )

    return constrained


def rows_sharding(batch_size: int) -> NamedSharding | None:
    """The layout of outputs whose leading axis holds a batch of `batch_size` rows on the current
    mesh (`LOGICAL_AXES["batch"]`), for `jax.jit(..., out_shardings=)`; None without a mesh."""
    mesh = current_mesh()
    if mesh is None:
        return None
    return NamedSharding(mesh, logical_spec(("batch",), (batch_size,), mesh))


def _mapped_sizes(args: tuple[Any, ...], in_axes: Any) -> set[int]:
    """The sizes of the axes `jax.vmap(f, in_axes)(*args)` maps over."""
    axes = in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(args)
    return {
        leaf.shape[axis]
        for arg, axis in zip(args, axes, strict=True)
        if axis is not None
        for leaf in jax.tree.leaves(arg)
    }


def members_split(num_members: int) -> bool:
    """Whether the current (traced) mesh splits `num_members` members over its `member` axis:
    one above 1 that divides them."""
    mesh = traced_mesh()
    return mesh is not None and mesh.shape["member"] > 1 and num_members % mesh.shape["member"] == 0


def member_vmap(f: Callable[..., Any], in_axes: Any = 0, out_axes: Any = 0) -> Callable[..., Any]:
    """`jax.vmap(f)` over an ensemble's member axis: on a mesh whose `member` axis is above 1
    and divides the member count, the mapped axis is split over it (`spmd_axis_name`), and
    `constrain` inside `f` leaves `member` to it."""

    def mapped(*args: Any) -> Any:
        sizes = _mapped_sizes(args, in_axes)
        if not sizes or not all(members_split(n) for n in sizes):
            return jax.vmap(f, in_axes=in_axes, out_axes=out_axes)(*args)

        def traced(*inner: Any) -> Any:
            token = _MEMBER_MAPPED.set(True)
            try:
                return f(*inner)
            finally:
                _MEMBER_MAPPED.reset(token)

        vmapped = jax.vmap(traced, in_axes=in_axes, out_axes=out_axes, spmd_axis_name="member")
        return vmapped(*args)

    return mapped


def example_vmap(f: Callable[..., Any], in_axes: Any = 0) -> Callable[..., Any]:
    """`jax.vmap(f)` over examples (a per-example gradient): on a mesh, the mapped axis is split
    as a batch axis is (`LOGICAL_AXES["batch"]`: `data`, and `member` with it)."""

    def mapped(*args: Any) -> Any:
        mesh, sizes = traced_mesh(), _mapped_sizes(args, in_axes)
        names: tuple[str, ...] = ()
        if mesh is not None and len(sizes) == 1:
            spec = logical_spec(("batch",), (sizes.pop(),), mesh)[0]
            names = (spec,) if isinstance(spec, str) else tuple(spec or ())
        spmd = {"spmd_axis_name": names} if names else {}
        return jax.vmap(f, in_axes=in_axes, **spmd)(*args)

    return mapped


def process_rows(batch_size: int) -> slice:
    """The rows of a global batch that this process's devices hold on the current mesh (all of
    them with one process, or no mesh, or a batch that `data` does not divide)."""
    mesh = current_mesh()
    if mesh is None or jax.process_count() == 1 or batch_size % mesh.shape["data"]:
        return slice(0, batch_size)
    shards = NamedSharding(mesh, P("data")).addressable_devices_indices_map((batch_size,))
    starts = sorted({s[0].start or 0 for s in shards.values()})
    stops = sorted({batch_size if s[0].stop is None else s[0].stop for s in shards.values()})
    if any(a != b for a, b in zip(starts[1:], stops[:-1], strict=True)):
        raise ValueError(f"this process's devices hold rows that are not contiguous: {shards}")
    return slice(starts[0], stops[-1])


def place_local_batch(batch: Any, batch_size: int) -> Any:
    """A global batch of `batch_size` rows from this process's rows of it (`process_rows`)."""
    mesh = current_mesh()
    if mesh is None or jax.process_count() == 1:
        return place_batch(batch)

    def put(x: np.ndarray, sharding: NamedSharding) -> jax.Array:
        shape = (batch_size, *np.shape(x)[1:])
        return jax.make_array_from_process_local_data(sharding, np.asarray(x), shape)

    global_shapes = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((batch_size, *np.shape(x)[1:]), np.asarray(x).dtype), batch
    )
    return jax.tree.map(put, batch, batch_shardings(global_shapes, mesh))


def is_primary() -> bool:
    """Whether this process writes the run's files (process 0; the only one without
    `jax.distributed`)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Waits until every process got here (one process: returns at once)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def to_host(x: jax.Array) -> np.ndarray:
    """A (possibly sharded, possibly multi-host) array as one numpy array in every process."""
    if getattr(x, "is_fully_addressable", True) or x.is_fully_replicated:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def overlapped(
    items: Iterable[Item], dispatch: Callable[[Item], Any]
) -> Iterator[tuple[Item, Any]]:
    """`(item, to_host(dispatch(item)))` for every item, in order, each read back only after the
    next is dispatched: the device computes one while the host waits on the other and prepares
    the next (JAX dispatches asynchronously). `dispatch` returns a tree of arrays."""
    pending = None
    for item in items:
        result = dispatch(item)
        if pending is not None:
            yield pending[0], jax.tree.map(to_host, pending[1])
        pending = (item, result)
    if pending is not None:
        yield pending[0], jax.tree.map(to_host, pending[1])
