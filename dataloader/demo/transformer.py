"""A small decoder-only transformer in plain JAX, trained with a hand-written Adam.

It reads MaxText's batch layout: attention stays within a segment
(``inputs_segmentation``) and looks only backwards; position embeddings start again
at 0 in every segment (``inputs_position``); the loss is the mean cross-entropy over
the targets whose ``targets_segmentation`` is not 0. Pre-layer-norm blocks, learned
positions, the output layer tied to the token embeddings. No flax, no optax.

Example:
    >>> shape = ModelShape(vocab_size=32, length=8, width=16, layers=1, heads=2, mlp=32)
    >>> state = init_state(jax.random.key(0), shape)
    >>> batch = {k: jnp.zeros((2, 8), jnp.int32) for k in ("inputs", "inputs_position",
    ...          "inputs_segmentation", "targets", "targets_segmentation")}
    >>> state, loss = train_step(state, batch, shape, 1e-3)
    >>> loss.shape
    ()
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The model's sizes (hashable: it is a static argument of the jitted step)."""

    vocab_size: int
    length: int
    width: int
    layers: int
    heads: int
    mlp: int


def init_params(key: jax.Array, shape: ModelShape) -> Params:
    keys = iter(jax.random.split(key, 2 + 4 * shape.layers))

    def normal(*dims: int, scale: float = 0.02) -> jax.Array:
        return jax.random.normal(next(keys), dims, jnp.float32) * scale

    w = shape.width
    blocks = [{
        "ln1": jnp.ones(w), "ln2": jnp.ones(w),
        "qkv": normal(w, 3 * w), "out": normal(w, w, scale=0.02 / (2 * shape.layers) ** 0.5),
        "up": normal(w, shape.mlp), "down": normal(shape.mlp, w, scale=0.02 / (2 * shape.layers) ** 0.5),
    } for _ in range(shape.layers)]
    return {"embed": normal(shape.vocab_size, w), "position": normal(shape.length, w),
            "blocks": blocks, "ln_f": jnp.ones(w)}


def _norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    x = x - x.mean(-1, keepdims=True)
    return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-5) * scale


def _attention(block: Params, x: jax.Array, mask: jax.Array, heads: int) -> jax.Array:
    b, n, w = x.shape
    q, k, v = jnp.split(x @ block["qkv"], 3, axis=-1)
    split = lambda t: t.reshape(b, n, heads, w // heads)  # noqa: E731
    scores = jnp.einsum("bqhd,bkhd->bhqk", split(q), split(k)) / (w // heads) ** 0.5
    scores = jnp.where(mask[:, None], scores, -1e9)
    mixed = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), split(v))
    return mixed.reshape(b, n, w) @ block["out"]


def logits(params: Params, batch: dict[str, jax.Array], shape: ModelShape) -> jax.Array:
    segments = batch["inputs_segmentation"]
    n = segments.shape[1]
    causal = jnp.tril(jnp.ones((n, n), bool))
    same = (segments[:, :, None] == segments[:, None, :]) & (segments[:, :, None] > 0)
    mask = causal[None] & same
    mask = mask | jnp.eye(n, dtype=bool)[None]  # padding attends to itself: no empty softmax
    x = params["embed"][batch["inputs"]] + params["position"][batch["inputs_position"]]
    for block in params["blocks"]:
        x = x + _attention(block, _norm(x, block["ln1"]), mask, shape.heads)
        x = x + jax.nn.gelu(_norm(x, block["ln2"]) @ block["up"]) @ block["down"]
    return _norm(x, params["ln_f"]) @ params["embed"].T


def loss_fn(params: Params, batch: dict[str, jax.Array], shape: ModelShape) -> jax.Array:
    """Mean next-token cross-entropy over the targets that carry a loss."""
    log_probs = jax.nn.log_softmax(logits(params, batch, shape))
    picked = jnp.take_along_axis(log_probs, batch["targets"][..., None], axis=-1)[..., 0]
    weight = (batch["targets_segmentation"] != 0).astype(jnp.float32)
    return -(picked * weight).sum() / jnp.maximum(weight.sum(), 1.0)


def init_state(key: jax.Array, shape: ModelShape) -> dict[str, Any]:
    """Parameters and Adam's moments (the step count ``t`` with them, for the bias correction)."""
    params = init_params(key, shape)
    zeros = jax.tree.map(jnp.zeros_like, params)
    return {"params": params, "m": zeros, "v": jax.tree.map(jnp.zeros_like, params),
            "t": jnp.zeros((), jnp.int32)}


@functools.partial(jax.jit, static_argnums=(2,))
def train_step(state: dict[str, Any], batch: dict[str, jax.Array], shape: ModelShape,
               learning_rate: float, b1: float = 0.9, b2: float = 0.98, eps: float = 1e-9
               ) -> tuple[dict[str, Any], jax.Array]:
    """One Adam step on the batch's loss."""
    loss, grads = jax.value_and_grad(loss_fn)(state["params"], batch, shape)
    t = state["t"] + 1
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], grads)
    scale = learning_rate * jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    params = jax.tree.map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + eps), state["params"], m, v)
    return {"params": params, "m": m, "v": v, "t": t}, loss


@functools.partial(jax.jit, static_argnums=(2,))
def eval_step(params: Params, batch: dict[str, jax.Array], shape: ModelShape) -> tuple[jax.Array, jax.Array]:
    """(summed loss, targets counted) over the batch's real rows (``mask``)."""
    log_probs = jax.nn.log_softmax(logits(params, batch, shape))
    picked = jnp.take_along_axis(log_probs, batch["targets"][..., None], axis=-1)[..., 0]
    weight = ((batch["targets_segmentation"] != 0) & batch["mask"][:, None]).astype(jnp.float32)
    return -(picked * weight).sum(), weight.sum()
