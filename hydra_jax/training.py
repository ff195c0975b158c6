"""Fine-tuning: one jitted train step (AdamW, warm-up, linear decay), orbax checkpoints, resume.

A run is a pure function of (model, data, settings): batch order comes from `(seed, epoch)`,
dropout keys from `(seed, step)`. So a run killed and restarted from its last checkpoint ends
with exactly the parameters of an uninterrupted run.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import logging
import math
import numbers
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import struct
from tqdm.auto import tqdm

from hydra_jax import extras
from hydra_jax.data import Dataset, loader
from hydra_jax.metrics import check_labels
from hydra_jax.models import Model, member_of, mimo
from hydra_jax.models.sharding import constrain_params, place_local_batch, place_params
from hydra_jax.models.vit import normalise

logger = logging.getLogger(__name__)

# `(params, batch, dropout key) -> (loss, accuracy)`, both scalars.
Loss = Callable[[Any, dict[str, jax.Array], jax.Array], tuple[jax.Array, jax.Array]]
# Which parameters train, by path (`("vision_model", "encoder", ...)`); the rest stay frozen.
Trainable = Callable[[tuple[str, ...]], bool]


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """One training run's settings, checked on creation (integers where counts are meant, finite
    numbers in range); `max_grad_norm=inf` turns gradient clipping off. `steps_per_call`: how
    many steps `fit` runs in one compiled call at most (`TrainStep.steps`); 1 runs one call per
    step. It does not change what a step computes."""

    epochs: float = 3.0
    batch_size: int = 32
    learning_rate: float = 5e-5
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 0
    checkpoint_every: int = 200
    log_every: int = 20
    steps_per_call: int = 8

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value, whole = getattr(self, field.name), field.type in ("int", int)
            kind = numbers.Integral if whole else numbers.Real
            if isinstance(value, bool) or not isinstance(value, kind):
                raise ValueError(
                    f"train.{field.name} must be {'an integer' if whole else 'a number'}, got "
                    f"{value!r}"
                )
            no_clipping = field.name == "max_grad_norm" and value == math.inf
            if not (math.isfinite(value) or no_clipping):
                raise ValueError(f"train.{field.name} must be finite, got {value}")
        positive = ("epochs", "batch_size", "checkpoint_every", "log_every", "max_grad_norm",
                    "steps_per_call")  # fmt: skip
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"train.{name} must be positive, got {getattr(self, name)}")
        for name in ("learning_rate", "weight_decay"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"train.warmup_fraction must be in [0, 1), got {self.warmup_fraction}")


@struct.dataclass
class TrainState:
    step: jax.Array  # [] int32
    params: Any
    opt_state: Any
    data_position: jax.Array  # [2] int32: (epoch, batch in epoch) of the next batch

    @classmethod
    def create(cls, params: Any, optimizer: optax.GradientTransformation) -> TrainState:
        """Step 0 with a copy of `params` (the train step donates its state)."""
        params = jax.tree.map(jnp.array, params)
        return cls(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=optimizer.init(params),
            data_position=jnp.zeros((2,), jnp.int32),
        )


def _decay_mask(params: Any) -> Any:
    """Weight decay on matrices only: not on biases, LayerNorm scales or embeddings' norms."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: x.ndim > 1 and "embedding" not in jax.tree_util.keystr(path), params
    )


def learning_rate_schedule(settings: TrainSettings, total_steps: int) -> optax.Schedule:
    """Linear warm-up over `warmup_fraction` of the steps, then linear decay to 0."""
    warmup = int(settings.warmup_fraction * total_steps)
    return optax.join_schedules(
        [
            optax.linear_schedule(0.0, settings.learning_rate, max(warmup, 1)),
            optax.linear_schedule(settings.learning_rate, 0.0, max(total_steps - warmup, 1)),
        ],
        [warmup],
    )


class TrainingLog:
    """What a run logs every `log_every` steps: `metrics.jsonl` (one JSON record a line) and
    TensorBoard event files in `tensorboard/` (scalars `train/KEY`), both in the run's workdir.
    Only process 0 writes. A run resumed at step s drops its records of later steps (they are
    run again): from `metrics.jsonl` here, from TensorBoard's view through the event files'
    purge step."""

    def __init__(self, workdir: Path, start: int, primary: bool):
        self.primary = primary
        if primary:
            _truncate_log(workdir / "metrics.jsonl", start)
            self.file = (workdir / "metrics.jsonl").open("a")
            # Event files are named by the second they open in: a run resumed within the same
            # second would overwrite the first run's file without a suffix of its own.
            suffix = f".{time.time_ns()}.{os.getpid()}"
            # Imported here: tensorboardX imports torch where it is installed (seconds), which
            # a process that never trains (evaluate.py, a refused command line) need not pay.
            tensorboard = extras.studies_import("tensorboardX", "training logs")
            self.board = tensorboard.SummaryWriter(
                str(workdir / "tensorboard"), purge_step=start + 1, filename_suffix=suffix
            )

    def write(self, record: dict[str, float]) -> None:
        if not self.primary:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        step = int(record["step"])
        for key, value in record.items():
            if key != "step":
                self.board.add_scalar(f"train/{key}", value, step)

    def close(self) -> None:
        if self.primary:
            self.file.close()
            self.board.close()


def make_optimizer(
    settings: TrainSettings, total_steps: int, trainable: Trainable | None = None
) -> optax.GradientTransformation:
    """AdamW with global-norm clipping, linear warm-up and decay; with `trainable`, parameters
    it rejects get no update at all (no weight decay, no optimiser state)."""
    schedule = learning_rate_schedule(settings, total_steps)
    optimizer = optax.chain(
        optax.clip_by_global_norm(settings.max_grad_norm),
        optax.adamw(schedule, weight_decay=settings.weight_decay, mask=_decay_mask),
    )
    if trainable is None:
        return optimizer

    def labels(params: Any) -> Any:
        def label(path: tuple, _: Any) -> str:
            return "train" if trainable(tuple(str(k.key) for k in path)) else "frozen"

        return jax.tree_util.tree_map_with_path(label, params)

    return optax.multi_transform({"train": optimizer, "frozen": optax.set_to_zero()}, labels)


def schedule_length(num_examples: int, settings: TrainSettings) -> tuple[int, int]:
    """(steps per epoch, total steps); incomplete batches are dropped."""
    steps_per_epoch = num_examples // settings.batch_size
    if steps_per_epoch == 0:
        raise ValueError(
            f"{num_examples} training examples do not fill one batch of {settings.batch_size}"
        )
    return steps_per_epoch, max(1, int(settings.epochs * steps_per_epoch))


def _check_training_labels(model: Model, train: Dataset) -> None:
    """Every training label a class of `model`'s classifier (an ensemble's members' classes)."""
    config = member_of(model.config) or model.config
    num_labels = getattr(config, "num_labels", 0)
    if num_labels < 1:
        raise ValueError(
            f"{type(config).__name__} has no classifier to train; add one with "
            "`with_classifier(model, num_classes, key)`"
        )
    try:
        check_labels(train.labels, len(train), num_labels)
    except ValueError as error:
        raise ValueError(f"training set: {error}") from None


def classification_loss(model: Model) -> Loss:
    """Cross-entropy of the model's logits against `batch["labels"]`, and accuracy."""

    def loss_fn(params: Any, batch: dict[str, jax.Array], key: jax.Array) -> tuple:
        logits = model.apply(params, **batch, dropout_rng=key).logits  # [B, C] or [B, M, C]
        labels = batch["labels"]
        if logits.ndim == 3:  # an ensemble: every member learns the labels
            labels = jnp.broadcast_to(labels[:, None], logits.shape[:2])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        accuracy = (logits.argmax(-1) == labels).mean()
        return loss, accuracy

    return loss_fn


def mimo_loss(model: Model, repetitions: int = 1, input_repetition: float = 0.0) -> Loss:
    """MIMO's training objective, a `fit(loss=...)`: each member reads its own image of the
    batch (`hydra_jax.models.mimo.member_indices`: the batch repeated `repetitions` times, a
    share `input_repetition` of rows the same image for every member) and the loss is the sum
    over members of their cross-entropy, averaged over rows, as the paper trains. The
    accuracy reported is the members' mean.
    """
    config = mimo.require(model.config, "mimo_loss")
    mimo.check_settings(repetitions, input_repetition)

    def loss_fn(params: Any, batch: dict[str, jax.Array], key: jax.Array) -> tuple:
        pixels, labels = batch["pixel_values"], batch["labels"]
        shuffle_key, dropout_key = jax.random.split(key)
        rows = mimo.member_indices(
            shuffle_key, labels.shape[0], config.num_members, repetitions, input_repetition
        ).T  # [R B, M]
        logits = mimo.apply_members(config, params, pixels[rows], dropout_key).logits
        member_labels = labels[rows]  # [R B, M]: member m's image's label
        per_member = optax.softmax_cross_entropy_with_integer_labels(logits, member_labels)
        accuracy = (logits.argmax(-1) == member_labels).mean()
        return per_member.sum(-1).mean(), accuracy

    return loss_fn


def locked_text_contrastive_loss(model: Model, text_features: jax.Array) -> Loss:
    """LiT-style contrastive loss for a dual encoder whose text tower is locked (frozen).

    `text_features` `[C, P, D_text]`: the text tower's pooled outputs of P caption templates per
    class, computed once. Each image is paired with a caption of its class under a template drawn
    from the step's key (so a resumed run draws the same captions); the projected, normalised
    pairs give CLIP's logits `[B, B]`. Images of one class share captions, so the targets are
    uniform over same-class partners (every row has its own pair), in both directions.
    Accuracy: the share of images whose best-scoring caption is of their class.
    """
    text_features = jnp.asarray(text_features)
    C, P, _ = text_features.shape

    def loss_fn(params: Any, batch: dict[str, jax.Array], key: jax.Array) -> tuple:
        images = model.apply(params, pixel_values=batch["pixel_values"], dropout_rng=key)
        labels = batch["labels"]
        template = jax.random.randint(jax.random.fold_in(key, C), labels.shape, 0, P)
        captions = text_features[labels, template] @ params["text_projection"]["kernel"]
        captions = normalise(captions)  # [B, E]
        logits = jnp.exp(params["logit_scale"]) * images.image_embeds @ captions.T  # [B, B]
        same = (labels[:, None] == labels[None, :]).astype(logits.dtype)
        targets = same / same.sum(-1, keepdims=True)  # symmetric pattern: rows serve both ways
        loss = (
            optax.softmax_cross_entropy(logits, targets).mean()
            + optax.softmax_cross_entropy(logits.T, targets).mean()
        ) / 2
        accuracy = same[jnp.arange(labels.shape[0]), logits.argmax(-1)].mean()
        return loss, accuracy

    return loss_fn


@dataclasses.dataclass(frozen=True)
class TrainStep:
    """A compiled training step, `make_train_step`'s result; both calls donate the state.

    `step(state, batch, key) -> (state, metrics)` trains on one batch with dropout key `key`.
    `step.steps(state, batches, keys, count) -> (state, metrics)` trains on the first `count`
    of K stacked batches in turn (`batches`' leaves `[K, ...]`, `keys` `[K]`, `count` an int32
    scalar in 1..K), in one compiled loop; `metrics`' leaves are `[K]`, their first `count`
    entries those of the steps taken. One program serves every `count`, so how a run's steps
    are grouped into calls does not change its numbers. A call of K steps costs less than K
    calls of one on a CPU: XLA:CPU maps a program's temporary buffers afresh on every call
    (docs/benchmarks.md, "Steps per call").
    """

    single: Callable
    steps: Callable

    def __call__(self, state: TrainState, batch: dict[str, jax.Array], key: jax.Array) -> tuple:
        return self.single(state, batch, key)


def make_train_step(
    model: Model, optimizer: optax.GradientTransformation, loss: Loss | None = None
) -> TrainStep:
    """The jitted training step of `model` (`TrainStep`: one batch, or several in one call).

    `loss` defaults to `classification_loss(model)`. The seed enters only through the keys, so
    ensemble members share one compiled step.
    """
    loss_fn = loss or classification_loss(model)

    def step(state: TrainState, batch: dict[str, jax.Array], key: jax.Array) -> tuple:
        (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params, batch, key
        )
        # optax's Adam bias correction raises a float to an int32 step count, an implicit
        # promotion that strict mode (our tests) refuses; only optax's own code runs standard.
        with jax.numpy_dtype_promotion("standard"):
            updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        new = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
        new = constrain_params(new)  # laid out as the state it took (on a mesh)
        return new, {"loss": loss, "accuracy": accuracy, "grad_norm": optax.tree.norm(grads)}

    def steps(
        state: TrainState, batches: dict[str, jax.Array], keys: jax.Array, count: jax.Array
    ) -> tuple:
        first = jax.tree.map(lambda x: x[0], batches)
        shapes = jax.eval_shape(step, state, first, keys[0])[1]
        metrics = jax.tree.map(lambda m: jnp.zeros(keys.shape[:1], m.dtype), shapes)  # [K]

        def body(i: jax.Array, carry: tuple) -> tuple:
            state, metrics = carry
            state, new = step(state, jax.tree.map(lambda x: x[i], batches), keys[i])
            return state, jax.tree.map(lambda m, v: m.at[i].set(v), metrics, new)

        return jax.lax.fori_loop(0, count, body, (state, metrics))

    return TrainStep(jax.jit(step, donate_argnums=0), jax.jit(steps, donate_argnums=0))


def _restore(manager: ocp.CheckpointManager, state: TrainState, workdir: Path) -> TrainState:
    """The newest readable checkpoint; a corrupt one is moved aside and the next older one used.

    Falling back is safe: a run is a pure function of (seed, step), so resuming from an older
    step reaches the same final parameters; the newer step is simply recomputed. The corrupt
    files are kept (not deleted) in `workdir/corrupt_checkpoints/STEP` for inspection.
    """
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            return manager.restore(step, args=ocp.args.StandardRestore(state))
        except Exception as error:  # orbax raises many types for damaged files
            path = Path(manager.directory) / str(step)
            aside = workdir / "corrupt_checkpoints" / str(step)
            aside.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(path), str(aside))
            manager.reload()
            logger.warning(
                "checkpoint step %d at %s is unreadable (%s: %s); moved it to %s and resuming "
                "from the previous kept step",
                step,
                path,
                type(error).__name__,
                str(error).splitlines()[0][:200],
                aside,
            )
    return state


def _truncate_log(log_file: Path, step: int) -> None:
    """Keeps the `metrics.jsonl` records of steps <= `step` (a killed run may have logged past
    its last checkpoint; those steps are about to be run again)."""
    if not log_file.is_file():
        return
    kept = []
    for line in log_file.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by the kill
        if record.get("step", 0) <= step:
            kept.append(line)
    log_file.write_text("".join(f"{line}\n" for line in kept))


@dataclasses.dataclass(frozen=True)
class _Call:
    """One call of the train step in flight: its first step, the examples of each of its
    steps, and its `[K]` losses (the first `len(examples)` its steps')."""

    first: int
    examples: list[np.ndarray]
    losses: jax.Array


def _non_finite(call: _Call) -> int | None:
    """The first (0-based) step of `call` whose loss is not finite, or None."""
    losses = np.asarray(call.losses)[: len(call.examples)]
    bad = np.flatnonzero(~np.isfinite(losses))
    return call.first + int(bad[0]) if bad.size else None


def _check_loss(call: _Call, step: int | None, steps_per_epoch: int, workdir: Path) -> None:
    """Raises `FloatingPointError` at `step`, `call`'s first with a non-finite loss (None: all
    finite, nothing raised)."""
    if step is None:
        return
    epoch, index = divmod(step, steps_per_epoch)
    raise FloatingPointError(
        f"training loss is {float(np.asarray(call.losses)[step - call.first])} at step "
        f"{step + 1} (epoch {epoch}, batch {index}: examples "
        f"{call.examples[step - call.first].tolist()}); stopped without checkpointing this "
        f"step, the last checkpoint in {workdir / 'checkpoints'} is intact"
    )


def _same_shapes(a: Any, b: Any) -> bool:
    return jax.tree.map(np.shape, a) == jax.tree.map(np.shape, b)


def _call_items(pending: collections.deque, data: Iterator, most: int) -> list[dict[str, Any]]:
    """The next call's loaded batches: up to `most`, in order, all of the first one's shapes;
    `pending` keeps those loaded ahead and not taken."""
    while len(pending) < most:
        pending.append(next(data))
    items = [pending.popleft()]
    while len(items) < most and _same_shapes(pending[0]["batch"], items[0]["batch"]):
        items.append(pending.popleft())
    return items


def _stacked(batches: list[Any]) -> Any:
    """Placed batches of one shape as one batch `[K, ...]` (host arrays stay on the host;
    arrays on a mesh keep their layout, the step axis in front)."""

    def stack(*leaves: Any) -> Any:
        return np.stack(leaves) if isinstance(leaves[0], np.ndarray) else jnp.stack(leaves)

    return jax.tree.map(stack, *batches)


@functools.partial(jax.jit, static_argnums=2)
def _step_keys(key: jax.Array, first: int, count: int) -> jax.Array:
    """`[count]` dropout keys of steps `first, first + 1, ...`: `fold_in(key, step)` each."""
    return jax.vmap(jax.random.fold_in, (None, 0))(key, first + jnp.arange(count))


def fit(
    model: Model,
    train: Dataset,
    settings: TrainSettings,
    workdir: str | Path,
    *,
    stop_after: int | None = None,
    step_fn: Any = None,
    loss: Loss | None = None,
    trainable: Trainable | None = None,
) -> Model:
    """Fine-tunes `model` on `train`, checkpointing to `workdir/checkpoints`, resuming if present.

    Args:
      model: the model with a classifier (or an ensemble: every member learns the labels).
      train: the training `Dataset`.
      settings: optimiser and schedule.
      workdir: where checkpoints and the training log (`TrainingLog`) go.
      stop_after: stop (as if killed) once this many steps are done; for tests.
      step_fn: a `make_train_step` result to reuse (same model config and optimiser settings).
        Runs of up to `settings.steps_per_call` batches of one shape train in one call of it.
      loss: the training objective (default: `classification_loss(model)`).
      trainable: which parameters train (default: all); the others are left exactly as given.

    Returns:
      The model with fine-tuned parameters.

    Raises:
      ValueError: with the default loss, training labels outside the classifier's classes, or
        a model without a classifier (before anything is written).
      FloatingPointError: a non-finite loss (the step and the batch's examples are named; the
        last checkpoint is left as it was). A call's losses are read back after the next call is
        dispatched, so the host never waits on the call in flight, and always before a log line
        or a checkpoint is written.
    """
    workdir = Path(workdir).absolute()
    steps_per_epoch, total_steps = schedule_length(len(train), settings)
    if loss is None:  # optax reads class -1 (NO_LABEL) as the last class, and class C as NaN
        _check_training_labels(model, train)
    workdir.mkdir(parents=True, exist_ok=True)
    optimizer = make_optimizer(settings, total_steps, trainable)
    state = TrainState.create(model.params, optimizer)
    manager = ocp.CheckpointManager(
        workdir / "checkpoints",
        options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True),
    )
    state = _restore(manager, place_params(state), workdir)  # laid out on the mesh, if any
    start = int(state.step)
    learning_rate = learning_rate_schedule(settings, total_steps)
    step_fn = step_fn or make_train_step(model, optimizer, loss)
    base_key = jax.random.key(settings.seed)
    batches = loader.training_batches(
        train, settings.batch_size, settings.seed, steps_per_epoch, total_steps
    )
    data = loader.iterate(batches, start)  # Grain; its position is the step (`data_position`)
    log = TrainingLog(workdir, start, jax.process_index() == 0)  # several processes: one writes
    progress = tqdm(total=total_steps, initial=start, desc=f"train {workdir.name}", leave=False)
    every = settings.steps_per_call
    pending: collections.deque = collections.deque()  # batches loaded, not yet trained on
    call = None  # the latest call, its losses not yet read back
    try:
        step = start
        while step < total_steps:
            # A call takes up to `every` steps, ends at a checkpoint, the run's end or
            # `stop_after`, and at a batch of another shape (text pads to the longest sequence).
            next_save = (step // settings.checkpoint_every + 1) * settings.checkpoint_every
            end = min(step + every, next_save, total_steps)
            if stop_after is not None:
                end = min(end, max(stop_after, step + 1))
            items = _call_items(pending, data, end - step)
            count = len(items)
            placed = [place_local_batch(item["batch"], settings.batch_size) for item in items]
            batches = _stacked(placed + placed[:1] * (every - count))  # one program for any count
            keys = _step_keys(base_key, step, every)
            state, metrics = step_fn.steps(state, batches, keys, np.int32(count))
            if call is not None:  # the previous call's: the host never waits on this one
                _check_loss(call, _non_finite(call), steps_per_epoch, workdir)
            call = _Call(step, [item["examples"] for item in items], metrics["loss"])
            progress.update(count)
            first, step = step, step + count
            logged = [done for done in range(first + 1, step + 1)
                      if done % settings.log_every == 0 or done == total_steps]  # fmt: skip
            save_now = step % settings.checkpoint_every == 0 or step == total_steps
            stop_now = stop_after is not None and step >= stop_after
            if logged or save_now or stop_now:  # read back before anything is written
                bad = _non_finite(call)
                values = {k: np.asarray(v) for k, v in metrics.items()} if logged else {}
                for done in logged:
                    if bad is None or done <= bad:  # the steps before a non-finite one
                        record = {k: float(v[done - 1 - first]) for k, v in values.items()}
                        record["learning_rate"] = float(learning_rate(done - 1))  # its update's
                        log.write({"step": done, **record})
                        progress.set_postfix(loss=f"{record['loss']:.3f}")
                _check_loss(call, bad, steps_per_epoch, workdir)
                call = None
            if save_now:
                position = jnp.array(divmod(step, steps_per_epoch), jnp.int32)
                state = state.replace(data_position=position)
                manager.save(step, args=ocp.args.StandardSave(state))
            if stop_now:
                break
        manager.wait_until_finished()
    finally:
        manager.close()
        progress.close()
        log.close()
    return Model(model.config, state.params)


def mimo_loss_from(ensemble: Model, settings: Any) -> Loss:
    """MIMO's study objective (its kind's `loss` hook): `mimo_loss` with the study's
    `mimo.repetitions` and `mimo.input_repetition`."""
    return mimo_loss(ensemble, settings["repetitions"], settings["input_repetition"])
