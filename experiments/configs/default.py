"""Default run: the tiny MoE preset on CPU, a few hundred steps on Python stdlib sources.

    python -m experiments.run --config=experiments/configs/default.py --workdir=workdir/default
    python -m experiments.run --config=experiments/configs/default.py:fsdp_ep   # a named layout

300 steps of 16 x 128 byte tokens with Muon, minutes on a laptop CPU. The training loss starts
at ln(512) = 6.24 (time and final validation loss: RESULTS.md, "Default run").

`arg` (after the colon, `base.parse_arg`): `layout`, a parallel layout of
`experiments/configs/layouts.py` (the default 'single' is one device), e.g. `default.py:fsdp_ep`
or `default.py:layout=fsdp_ep`.
"""

from experiments.configs import base


def get_config(arg=None):
  arg = base.parse_arg(arg, layout="single")
  config = base.get_base_config()
  base.set_layout(config, arg.layout)
  return config
