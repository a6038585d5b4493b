"""LLVM's cheapest compile settings for test programs (about half the compile time; the numbers
change within float tolerance only): as `jax.jit` compiler options and as XLA_FLAGS for
subprocesses."""

FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
CHEAP_XLA_FLAGS = " ".join(f"--{k}={str(v).lower()}" for k, v in FAST_COMPILE.items())
