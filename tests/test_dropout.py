"""Our dropout draws `flax.linen.Dropout`'s masks bit for bit, so trained results do not move."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hydra_jax.models.dropout import Dropout, bernoulli, threefry2x32
from hydra_jax.testing import assert_close

SHAPES = [(7,), (3, 5, 1, 9), (2, 50, 72), (1,)]


@pytest.mark.parametrize("shape", SHAPES)
def test_masks_are_jax_bernoulli_bit_for_bit(shape):
    draw = jax.jit(bernoulli, static_argnums=(1, 2))
    for key in (
        jax.random.key(0),
        jax.random.fold_in(jax.random.key(12345), 7),
        jax.random.PRNGKey(3),  # a raw uint32 key
    ):
        for p in (0.9, 0.5, 0.1):
            expected = jax.random.bernoulli(key, p, shape)
            got = draw(key, p, shape)
            assert got.dtype == expected.dtype and got.shape == expected.shape
            np.testing.assert_array_equal(got, expected)


def test_threefry_matches_jax_on_known_counters():
    # JAX's own hash of counters (0, i): the bits `jax.random.bits` draws for 16 values.
    key = jax.random.key(42)
    h0, h1 = threefry2x32(
        jax.random.key_data(key), jnp.zeros(16, jnp.uint32), jnp.arange(16, dtype=jnp.uint32)
    )
    np.testing.assert_array_equal(h0 ^ h1, jax.random.bits(key, (16,), jnp.uint32))


def test_other_key_kinds_and_64_bit_mode_take_jax_bernoulli():
    key = jax.random.key(0, impl="rbg")
    np.testing.assert_array_equal(
        bernoulli(key, 0.7, (4, 33)), jax.random.bernoulli(key, 0.7, (4, 33))
    )
    with jax.enable_x64(True):  # a float p then draws float64 uniforms: other bits
        key = jax.random.key(5)
        np.testing.assert_array_equal(
            bernoulli(key, 0.7, (4, 33)), jax.random.bernoulli(key, 0.7, (4, 33))
        )


class _Net(nn.Module):
    """Two dropouts in one module, one broadcast over an axis, as a model uses them."""

    dropout: type[nn.Module]

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        h = self.dropout(0.1)(x, deterministic=deterministic)
        return self.dropout(0.3, broadcast_dims=(1,))(h * 2.0, deterministic=deterministic)


@pytest.mark.parametrize("deterministic", [False, True])
def test_module_equals_flax_dropout(deterministic):
    x = jax.random.normal(jax.random.key(1), (4, 6, 10))
    ours, flax_net = _Net(Dropout), _Net(nn.Dropout)
    for seed in range(3):
        rngs = {"dropout": jax.random.key(seed)}
        expected = flax_net.apply({}, x, deterministic, rngs=rngs)
        got = ours.apply({}, x, deterministic, rngs=rngs)
        np.testing.assert_array_equal(got == 0, expected == 0)  # the same mask
        assert_close(got, expected)  # the same scaling, up to float32 rounding
    if not deterministic:  # the masks really drop (a test that cannot pass on the identity)
        assert 0 < int((expected == 0).sum()) < x.size


def test_rate_one_drops_everything():
    x = jnp.ones((3, 4))
    out = Dropout(1.0).apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(0)})
    np.testing.assert_array_equal(out, jnp.zeros_like(x))
