"""Basic layers: input-first linear map, RMSNorm, SwiGLU MLP, token embedding.

Every parameter is created with `nn.with_logical_partitioning` so the logical axis
names of `composer_jax.model.axes` travel with it. Parameters are stored in
`param_dtype` and cast to the compute `dtype` at use (mixed precision); RMSNorm
statistics are always float32.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from composer_jax.model import axes
from composer_jax.parallel import context_mesh


def param_init(stddev: float, names: tuple[str, ...]):
  """Normal(0, stddev) initializer (HF `initializer_range`) boxed with logical names."""
  axes.check_names(names)
  return nn.with_logical_partitioning(nn.initializers.normal(stddev), names)


class Linear(nn.Module):
  """y = x @ W with W stored input-first, `[*in_shape, *out_shape]`.

  Contracts the last `len(in_shape)` axes of x: `x [..., *in_shape] -> [..., *out_shape]`.
  """

  in_shape: tuple[int, ...]
  out_shape: tuple[int, ...]
  names: tuple[str, ...]  # logical names of the kernel, len(in_shape) + len(out_shape)
  init_std: float
  dtype: str
  param_dtype: str

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kernel = self.param(
      "kernel",
      param_init(self.init_std, self.names),
      tuple(self.in_shape) + tuple(self.out_shape),
      self.param_dtype,
    )
    n_in = len(self.in_shape)
    lead = x.shape[: x.ndim - n_in]
    # One token axis: the kernel's gradient is then one contraction; over [B, L] XLA:CPU
    # transposes an operand into a copy for it (RESULTS.md, 2026-12-06). Not when the
    # sequence is split: [B, L / cp] -> [B * L] is no tiling, and GSPMD would gather it.
    flat = len(lead) > 1 and context_mesh.shards("seq") == 1
    if flat:
      x = x.reshape(-1, *self.in_shape)
    contract = (tuple(range(x.ndim - n_in, x.ndim)), tuple(range(n_in)))
    y = jax.lax.dot_general(x.astype(self.dtype), kernel.astype(self.dtype), (contract, ((), ())))
    return y.reshape(*lead, *self.out_shape) if flat else y


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """RMSNorm (arXiv 1910.07467) over the last axis; statistics in float32.

  Matches HF `DeepseekV3RMSNorm`: normalize in float32, cast back, then scale.
  """
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
  return scale.astype(x.dtype) * y.astype(x.dtype)


class RMSNorm(nn.Module):
  """RMSNorm with a learned `scale [dim] (norm)` initialized to ones."""

  dim: int
  eps: float
  param_dtype: str

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = self.param(
      "scale",
      nn.with_logical_partitioning(nn.initializers.ones, ("norm",)),
      (self.dim,),
      self.param_dtype,
    )
    return rms_norm(x, scale, self.eps)


class SwiGLU(nn.Module):
  """SwiGLU MLP (arXiv 2002.05202): down(silu(x @ gate) * (x @ up)).

  `x [..., D] -> [..., D]`, hidden width `hidden` with logical name `mlp`.
  """

  embed: int
  hidden: int
  init_std: float
  dtype: str
  param_dtype: str

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kw = dict(init_std=self.init_std, dtype=self.dtype, param_dtype=self.param_dtype)
    gate = Linear((self.embed,), (self.hidden,), ("embed", "mlp"), name="gate", **kw)(x)
    up = Linear((self.embed,), (self.hidden,), ("embed", "mlp"), name="up", **kw)(x)
    return Linear((self.hidden,), (self.embed,), ("mlp", "embed"), name="down", **kw)(
      nn.silu(gate) * up
    )


class Embed(nn.Module):
  """Token embedding `embedding [V, D] (vocab, embed)`: `tokens [...] -> [..., D]`."""

  vocab: int
  embed: int
  init_std: float
  dtype: str
  param_dtype: str

  @nn.compact
  def __call__(self, tokens: jax.Array) -> jax.Array:
    table = self.param(
      "embedding",
      param_init(self.init_std, ("vocab", "embed")),
      (self.vocab, self.embed),
      self.param_dtype,
    )
    # Gathered (FSDP) before the lookup: a lookup into the table as stored, `embed` split over
    # fsdp x context, comes out split on D, and GSPMD can only reshard that to batch x seq
    # (fsdp, context) by replicating it (XLA's "involuntary full rematerialization").
    table = context_mesh.constrain(table, ("vocab", "act_embed"))
    return jnp.take(table, tokens, axis=0).astype(self.dtype)
