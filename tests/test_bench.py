"""The accelerator and scoring benchmarks run at tiny shapes, so they cannot rot unnoticed (the
scoring one did once); the attention benchmark times the same function in four formulations;
the ensemble benchmark builds every single-pass ensemble it times; bench/calls.py refuses step
counts it cannot time."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import hydra_jax as hj
from bench import ab, accelerator, calls, scoring
from bench.attention import head_major_normalised, one_block, token_major
from bench.ensemble import efficient_forwards
from hydra_jax import testing
from hydra_jax.models import BertConfig, with_classifier
from hydra_jax.models.attention import Attention, padding_bias
from hydra_jax.testing import assert_close

pytestmark = pytest.mark.slow  # many compiled programs (`make test-fast` leaves it out)


def test_accelerator_bench_runs_at_tiny_shapes(capsys):
    results = accelerator.main(["--tiny", "--repeats", "1"])
    assert set(results) == {"ViT (tiny)", "BERT (tiny)"}
    for times in results.values():
        assert set(times) == {"single bfloat16", "hydra bfloat16", "deep_ensemble bfloat16"}
        assert all(t > 0 for t in times.values())
    out = capsys.readouterr().out
    assert out.count("bfloat16: hydra / single") == 2


def test_ab_bench_refuses_options_that_are_not_json_objects(capsys):
    for bad in ("[1]", "x"):
        with pytest.raises(SystemExit):
            ab.main(["--options", "{}", bad])
        assert f"JSON objects of XLA compile options, not {bad!r}" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [["--steps", "0,8"], ["--steps", "4,x"], ["--rounds", "0"]])
def test_calls_bench_refuses_step_counts_that_are_not_positive(capsys, bad):
    with pytest.raises(SystemExit):
        calls.main(bad)
    assert "--steps takes positive step counts" in capsys.readouterr().err


def test_attention_bench_compares_the_same_function():
    """bench/attention.py's earlier formulations compute our layer's output and gradient."""
    rng = np.random.default_rng(0)
    B, T, N, K = 2, 5, 3, 4
    layer = Attention(N, K, N * K)
    x = jnp.asarray(rng.standard_normal((B, T, N * K)), jnp.float32)
    bias = padding_bias(jnp.asarray([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]), jnp.float32)
    params = layer.init(jax.random.key(0), x, bias, None)["params"]
    params = jax.tree.map(lambda p: p + 0.1 * jnp.ones_like(p), params)  # non-zero biases

    def ours(p):
        return layer.apply({"params": p}, x, bias, None)[0]

    # Each function and gradient compiled as one program (run eagerly, every operation of
    # each would compile on its own).
    grad = jax.jit(jax.grad(lambda p: jnp.sum(ours(p) ** 2)))(params)
    for formulation in (one_block, head_major_normalised, token_major):
        before = lambda p, f=formulation: f(p, x, bias, K)  # noqa: E731
        assert_close(jax.jit(ours)(params), jax.jit(before)(params))  # other programs, one function
        grad_before = jax.jit(jax.grad(lambda p, f=before: jnp.sum(f(p) ** 2)))(params)
        # As one vector: the key bias's exact gradient is 0 (softmax ignores a shift per query),
        # so its float32 values are rounding noise of the other gradients' scale.
        assert_close(ravel_pytree(grad)[0], ravel_pytree(grad_before)[0])


def test_scoring_bench_runs_on_a_small_batch(capsys):
    assert scoring.main(["--examples", "2", "--tokens", "16", "--repeats", "1"]) > 0
    assert "ratio scoring / forward" in capsys.readouterr().out


def test_ensemble_bench_builds_each_single_pass_ensemble():
    """At M = 3, gamma = 2, 12 heads in a width of 48 do not divide at alpha 2 (32 wide, 24
    heads) but do at alpha 3: the bench falls back to it, as for MiniLM (384 wide, 12 heads)."""
    config = BertConfig(testing.encoder(layers=1, heads=12, head_dim=4, mlp_dim=12), 30, 12, 2)
    model = with_classifier(hj.Model.init(config, jax.random.key(0)), 2, jax.random.key(1))
    forwards = efficient_forwards(model, 3)
    assert list(forwards) == ["batch_ensemble (M=3)", "lora_ensemble (M=3)",
                              "packed_ensemble (M=3, alpha=3, gamma=2)"]  # fmt: skip
    batch = {"input_ids": np.ones((2, 5), np.int32), "attention_mask": np.ones((2, 5), np.int32)}
    for forward, weights in forwards.values():
        assert forward(weights, batch).shape == (2, 3, 2)
    vit = testing.vit(layers=1, heads=12, head_dim=4, mlp_dim=12, num_labels=2)
    forwards = efficient_forwards(hj.Model.init(vit, jax.random.key(2)), 3)
    assert list(forwards)[-1] == "mimo (M=3)"  # an image classifier's
    forward, weights = forwards["mimo (M=3)"]
    assert forward(weights, {"pixel_values": np.ones((2, 3, 8, 8), np.float32)}).shape == (2, 3, 2)
