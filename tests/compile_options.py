"""LLVM's cheapest compile settings, as XLA_FLAGS for every test process (tests/conftest.py)
and the multi-process launches (tests/local_launch.py). Test programs are small and compiled
once: a third less CPU time for tests/rl/modes_test.py + tests/train/loop_test.py (212 -> 142
CPU s, 2026-12-05); the numbers change within float tolerance only."""

CHEAP_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
