"""Fine-tuning: learning happens; a killed run resumes to exactly the uninterrupted result, also
past a corrupt checkpoint; bad settings and non-finite losses stop with the cause named."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import struct
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hydra_jax as hj
from hydra_jax import testing
from hydra_jax.data import TokenizedSet, loader
from hydra_jax.models import BertConfig, with_classifier
from hydra_jax.testing import assert_trained_params_close
from hydra_jax.training import (
    TrainingLog,
    TrainSettings,
    TrainState,
    TrainStep,
    _step_keys,
    fit,
    make_optimizer,
    make_train_step,
    schedule_length,
)

pytestmark = pytest.mark.slow  # many compiled programs (`make test-fast` leaves it out)

CONFIG = BertConfig(
    testing.encoder(layers=2, heads=2, head_dim=5, mlp_dim=14, dropout=0.1),
    vocab_size=19, max_positions=20, type_vocab_size=2,
)  # fmt: skip
SETTINGS = TrainSettings(
    epochs=2, batch_size=8, learning_rate=3e-3, warmup_fraction=0.2, checkpoint_every=4, log_every=2
)


@pytest.fixture(scope="module")
def task():
    """Label = whether token 3 occurs: learnable by attention, not by position alone."""
    rng = np.random.default_rng(0)
    tokens, labels = [], []
    for _ in range(50):  # 6 batches of 8 per epoch
        length = rng.integers(3, 12)
        t = rng.integers(4, 19, length)
        label = rng.integers(0, 2)
        if label:
            t[rng.integers(1, length)] = 3
        tokens.append(np.r_[1, t, 2].astype(np.int32))
        labels.append(label)
    model = with_classifier(hj.Model.init(CONFIG, jax.random.key(0)), 2, jax.random.key(1))
    data = TokenizedSet(tokens, np.array(labels))
    total = schedule_length(len(data), SETTINGS)[1]
    step = make_train_step(model, make_optimizer(SETTINGS, total))  # compiled once for all runs
    return model, data, step


@pytest.fixture(scope="module")
def straight(task, tmp_path_factory):
    model, data, step = task
    workdir = tmp_path_factory.mktemp("straight")
    return fit(model, data, SETTINGS, workdir, step_fn=step), workdir


def assert_same_params(a, b):
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_array_equal(x, y)


def steps_logged(workdir) -> list[int]:
    return [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").open()]


def test_a_run_resumed_within_the_same_second_keeps_the_first_runs_events(tmp_path):
    """TensorBoard names event files by the second: a second writer must not overwrite the
    first's file (the resumed run below opens its log in the very same second)."""
    with mock.patch("time.time", return_value=1_700_000_000.0):
        first = TrainingLog(tmp_path, 0, primary=True)
        first.write({"step": 2, "loss": 1.0})
        first.close()
        resumed = TrainingLog(tmp_path, 2, primary=True)
        resumed.write({"step": 4, "loss": 0.5})
        resumed.close()
    assert len(list((tmp_path / "tensorboard").iterdir())) == 2
    assert tensorboard_scalars(tmp_path / "tensorboard")["train/loss"] == {2: 1.0, 4: 0.5}


def test_killed_run_resumes_to_the_uninterrupted_result(task, straight, tmp_path):
    model, data, step = task
    straight_model, straight_dir = straight
    # Killed after 6 steps; the last checkpoint is step 4, so 2 steps are lost and redone.
    fit(model, data, SETTINGS, tmp_path, stop_after=6, step_fn=step)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["4"]
    assert steps_logged(tmp_path) == [2, 4, 6]  # step 6 was logged, then lost
    resumed = fit(model, data, SETTINGS, tmp_path, step_fn=step)
    assert_same_params(straight_model, resumed)
    # The log was cut back to the restored step: no step appears twice.
    assert steps_logged(tmp_path) == steps_logged(straight_dir) == [2, 4, 6, 8, 10, 12]
    # The input model is untouched (the train step donates a copy, not the caller's weights).
    assert not np.array_equal(
        model.params["classifier"]["kernel"], straight_model.params["classifier"]["kernel"]
    )
    records = [json.loads(line) for line in (straight_dir / "metrics.jsonl").open()]
    assert records[-1]["loss"] < records[0]["loss"]
    # TensorBoard sees the same scalars (the redone steps 5-6 replace the lost ones).
    resumed_records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    board = tensorboard_scalars(tmp_path / "tensorboard")
    assert set(board) == {f"train/{k}" for k in ("loss", "accuracy", "grad_norm", "learning_rate")}
    for key, values in board.items():
        want = {r["step"]: r[key.removeprefix("train/")] for r in resumed_records}
        assert list(values) == list(want), key
        np.testing.assert_allclose(list(values.values()), list(want.values()), rtol=1e-6)
    # The learning rate of each logged step's update (0-based s = 1, 3, ..., 11): linear
    # warm-up over int(0.2 * 12) = 2 steps, then linear decay to 0 over the other 10.
    peak, s = SETTINGS.learning_rate, np.arange(1, 12, 2)
    want = np.where(s < 2, peak * s / 2, peak * (1 - (s - 2) / 10))
    np.testing.assert_allclose([r["learning_rate"] for r in records], want, rtol=1e-6)


def tensorboard_scalars(directory) -> dict[str, dict[int, float]]:
    """The last value of each step of every scalar in `directory`'s event files (TFRecords of
    `Event` protos: length, its CRC, the record, its CRC), files in the order written."""
    from tensorboardX.proto import event_pb2

    scalars: dict[str, dict[int, float]] = {}
    for path in sorted(directory.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime_ns):
        data, i = path.read_bytes(), 0
        while i < len(data):
            (length,) = struct.unpack("<Q", data[i : i + 8])
            event = event_pb2.Event.FromString(data[i + 12 : i + 12 + length])
            i += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = value.simple_value
    return {tag: dict(sorted(values.items())) for tag, values in scalars.items()}


def _truncate_largest_file(step_dir):
    largest = max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    largest.write_bytes(largest.read_bytes()[: largest.stat().st_size // 2])


def _empty_metadata(step_dir):
    for path in step_dir.rglob("*METADATA*"):
        if path.is_file():
            path.write_text("")


@pytest.mark.parametrize("damage", [_truncate_largest_file, _empty_metadata])
def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(
    task, straight, tmp_path, caplog, damage
):
    model, data, step = task
    fit(model, data, SETTINGS, tmp_path, stop_after=9, step_fn=step)  # checkpoints 4 and 8 kept
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["4", "8"]
    damage(tmp_path / "checkpoints" / "8")
    with caplog.at_level(logging.WARNING, logger="hydra_jax.training"):
        resumed = fit(model, data, SETTINGS, tmp_path, step_fn=step)
    (message,) = [r.getMessage() for r in caplog.records if r.name == "hydra_jax.training"]
    assert "checkpoint step 8 at" in message and "is unreadable" in message
    assert "resuming from the previous kept step" in message
    assert (tmp_path / "corrupt_checkpoints" / "8").is_dir()  # kept for inspection
    assert_same_params(straight[0], resumed)  # a pure function of (seed, step): same result
    assert steps_logged(tmp_path) == [2, 4, 6, 8, 10, 12]


def test_non_finite_loss_stops_training_and_names_the_step(task, tmp_path):
    model, data, step = task
    broken = jax.tree.map(np.asarray, model.params)
    broken["classifier"]["kernel"] = np.full_like(broken["classifier"]["kernel"], np.inf)
    with pytest.raises(FloatingPointError, match=r"training loss is nan at step 1 \(epoch 0, "
                       r"batch 0: examples \[\d+(, \d+){7}\]\)"):  # fmt: skip
        fit(hj.Model(model.config, broken), data, SETTINGS, tmp_path, step_fn=step)
    assert not any((tmp_path / "checkpoints").iterdir())


@pytest.mark.parametrize(("bad_step", "kept"), [(4, []), (5, ["4"]), (3, [])])
def test_a_later_non_finite_loss_is_caught_before_the_next_checkpoint(
    task, tmp_path, bad_step, kept
):
    """Losses are read back a call late; a checkpoint (every 4 steps) is never written after a
    non-finite step, whether that step is the checkpoint's own, the one before it, or inside a
    call of several steps."""
    model, data, step = task
    taken = []  # steps trained, in order

    def poisoned(state, batches, keys, count):  # the real steps, the loss of `bad_step` NaN
        state, metrics = step.steps(state, batches, keys, count)
        first = len(taken)
        taken.extend(range(first + 1, first + int(count) + 1))
        if bad_step in taken[first:]:
            metrics = {**metrics, "loss": metrics["loss"].at[bad_step - 1 - first].set(np.nan)}
        return state, metrics

    with pytest.raises(FloatingPointError, match=rf"training loss is nan at step {bad_step} "):
        fit(model, data, SETTINGS, tmp_path, step_fn=TrainStep(step.single, poisoned))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == kept
    assert steps_logged(tmp_path) == [s for s in (2, 4) if s < bad_step]
    assert len(taken) <= -(-bad_step // 4) * 4  # stopped at once, not at the end of the epoch


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("batch_size", 0, "train.batch_size must be positive, got 0"),
     ("epochs", -1.0, "train.epochs must be positive"),
     ("checkpoint_every", 0, "train.checkpoint_every must be positive"),
     ("steps_per_call", 0, "train.steps_per_call must be positive, got 0"),
     ("steps_per_call", 2.0, "train.steps_per_call must be an integer, got 2.0"),
     ("warmup_fraction", 1.0, r"train.warmup_fraction must be in \[0, 1\)"),
     ("batch_size", 2.5, "train.batch_size must be an integer, got 2.5"),
     ("batch_size", "32", "train.batch_size must be an integer, got '32'"),
     ("log_every", True, "train.log_every must be an integer, got True"),
     ("seed", 1.5, "train.seed must be an integer, got 1.5"),
     ("epochs", float("inf"), "train.epochs must be finite, got inf"),
     ("learning_rate", float("nan"), "train.learning_rate must be finite, got nan"),
     ("weight_decay", "0.01", "train.weight_decay must be a number, got '0.01'")],
)  # fmt: skip
def test_bad_settings_are_refused_by_name(field, value, message):
    with pytest.raises(ValueError, match=message):
        TrainSettings(**{field: value})


def test_numpy_numbers_and_unclipped_gradients_are_accepted():
    settings = TrainSettings(batch_size=np.int64(4), epochs=np.float32(0.5), max_grad_norm=np.inf)
    assert settings.batch_size == 4 and settings.max_grad_norm == np.inf


@pytest.mark.parametrize(
    ("label", "message"),
    [(2, r"labels must be classes in \[0, 2\); examples \[7\] have \[2\]"),
     (-1, r"labels must be classes in \[0, 2\); examples \[7\] have \[-1\]")],
)  # fmt: skip
def test_labels_outside_the_classifier_are_refused_before_anything_is_written(
    task, tmp_path, label, message
):
    """optax reads class -1 as the last class and class C as NaN: refused up front instead."""
    model, data, step = task
    labels = data.labels.copy()
    labels[7] = label  # -1 is also NO_LABEL, the label of OOD examples
    bad = TokenizedSet(data.tokens, labels)
    with pytest.raises(ValueError, match=r"training set: " + message):
        fit(model, bad, SETTINGS, tmp_path / "run", step_fn=step)
    assert not (tmp_path / "run").exists()


def test_too_few_examples_for_a_batch(task, tmp_path):
    model, data, _ = task
    small = TokenizedSet(data.tokens[:5], data.labels[:5])
    with pytest.raises(ValueError, match="5 training examples do not fill one batch of 8"):
        fit(model, small, SETTINGS, tmp_path)


def test_several_steps_in_one_call_are_the_single_steps(task):
    """`TrainStep.steps` runs the first `count` of K stacked batches as `count` single steps
    would (within float32 rounding: another program), the rest of the stack unused."""
    model, data, step = task
    rng = np.random.default_rng(5)
    K = SETTINGS.steps_per_call  # fit's program for these shapes: compiled already
    batches = [data.batch(rng.choice(len(data), 8, replace=False), length=16) for _ in range(K)]
    keys = jax.random.split(jax.random.key(7), K)
    optimizer = make_optimizer(SETTINGS, schedule_length(len(data), SETTINGS)[1])
    single, metrics = TrainState.create(model.params, optimizer), []
    for batch, key in zip(batches[:3], keys[:3], strict=True):
        single, m = step(single, batch, key)
        metrics.append(m)
    stacked = jax.tree.map(lambda *xs: np.stack(xs), *batches)
    start = TrainState.create(model.params, optimizer)
    several, many = step.steps(start, stacked, keys, np.int32(3))
    assert int(several.step) == 3
    # Two programs: key biases (exact gradient 0) move by Adam-scaled rounding noise, left out.
    assert_trained_params_close(several.params, single.params, rtol=1e-5, atol=1e-6)
    for name in ("loss", "accuracy", "grad_norm"):
        np.testing.assert_allclose(many[name][:3], [m[name] for m in metrics], rtol=1e-5)


def test_each_step_of_a_call_gets_its_own_steps_dropout_key():
    key = jax.random.key(4)
    want = [jax.random.key_data(jax.random.fold_in(key, s)) for s in (5, 6, 7)]
    np.testing.assert_array_equal(jax.random.key_data(_step_keys(key, 5, 3)), want)


def test_fit_groups_steps_into_calls_within_checkpoints_and_batch_shapes(tmp_path):
    """Calls take at most `steps_per_call` steps, in order, end at every checkpoint and hold
    batches of one shape (texts pad to their batch's longest, in multiples of 16 tokens)."""
    rng = np.random.default_rng(3)
    lengths = rng.choice([5, 5, 5, 20, 40], 96)  # batches of 16, 32 or 48 tokens
    data = TokenizedSet([np.ones(n, np.int32) for n in lengths], np.zeros(96, np.int64))
    settings = dataclasses.replace(SETTINGS, epochs=1, batch_size=4, steps_per_call=5,
                                   checkpoint_every=7)  # fmt: skip
    calls = []  # (first step, count, the call's batches' tokens)

    def counted(state, batches, keys, count):  # no model: advances the step, records the call
        calls.append((int(state.step), int(count), batches["input_ids"].shape[2]))
        losses = jnp.zeros(keys.shape[:1])
        return state.replace(step=state.step + count), {"loss": losses, "accuracy": losses}

    params = {"w": np.zeros(2, np.float32)}
    fit(hj.Model(CONFIG, params), data, settings, tmp_path, loss=lambda *_: (0.0, 0.0),
        step_fn=TrainStep(None, counted))  # fmt: skip
    firsts = [first for first, _, _ in calls]
    counts = [count for _, count, _ in calls]
    assert firsts == list(itertools.accumulate([0, *counts[:-1]])) and sum(counts) == 24
    assert all(1 <= count <= 5 for count in counts)
    assert {7, 14, 21}.issubset(firsts)  # no call runs over a checkpoint
    batches = loader.training_batches(data, 4, SETTINGS.seed, 24, 24)
    tokens = [batches[s]["batch"]["input_ids"].shape[1] for s in range(24)]
    assert len(set(tokens)) == 3
    for first, count, length in calls:
        assert tokens[first : first + count] == [length] * count
        end = first + count
        if count < 5 and end % 7 and end < 24:  # cut short by the next batch's shape alone
            assert tokens[end] != length
