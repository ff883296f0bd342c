"""The demo's model: a 2-layer MLP on 8x8 digits, trained with plain ``jax.grad`` SGD.

Example:
    >>> params = init_params(jax.random.key(0), hidden=16)
    >>> batch = {"image": jnp.zeros((4, 8, 8)), "label": jnp.zeros(4, jnp.int32)}
    >>> params, loss = train_step(params, batch, 0.1)
    >>> loss.shape
    ()
"""

from __future__ import annotations

import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

INPUTS, CLASSES = 64, 10


def init_params(key: jax.Array, hidden: int) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (INPUTS, hidden)) * (2.0 / INPUTS) ** 0.5,
        "b1": jnp.zeros(hidden),
        "w2": jax.random.normal(k2, (hidden, CLASSES)) * (1.0 / hidden) ** 0.5,
        "b2": jnp.zeros(CLASSES),
    }


def logits(params: dict[str, jax.Array], images: jax.Array) -> jax.Array:
    x = images.reshape(images.shape[0], -1)
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


def loss_fn(params: dict[str, jax.Array], batch: dict[str, jax.Array]) -> jax.Array:
    log_probs = jax.nn.log_softmax(logits(params, batch["image"]))
    return -jnp.mean(jnp.take_along_axis(log_probs, batch["label"][:, None], axis=1))


@jax.jit
def train_step(params: dict[str, jax.Array], batch: dict[str, jax.Array], lr: float) -> tuple[Any, jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss


def accuracy(params: dict[str, jax.Array], images: np.ndarray, labels: np.ndarray) -> float:
    predicted = jnp.argmax(logits(params, jnp.asarray(images, jnp.float32) / 16.0), axis=-1)
    return float(jnp.mean(predicted == jnp.asarray(labels)))


def fingerprint(batch: Any) -> str:
    """A short hash of a batch's contents (every leaf's dtype, shape and bytes)."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(batch):
        array = np.asarray(leaf)
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:16]
