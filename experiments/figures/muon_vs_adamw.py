"""Figure: validation loss vs training tokens, Muon vs AdamW, each at its best swept LR.

    python -m experiments.figures.muon_vs_adamw --workdir=workdir/muon_vs_adamw [--smoke]

Trains the default model (experiments/configs/default.py) on the same token stream (same
data seed, batch and steps) with

1. AdamW everywhere, sweeping its LR (`optim.adam_lr`) over ADAMW_LRS;
2. Muon for the hidden matrices and AdamW, at the best LR of step 1, for embeddings, output
   head, router and norms (Moonlight's recipe), sweeping the Muon LR (`optim.lr`) over
   MUON_LRS (with 'consistent_rms' scaling Muon's LR is on AdamW's scale).

The best run of each (lowest final validation loss) is drawn bold, the others faint.
Writes `<workdir>/muon_vs_adamw.png` and `<workdir>/muon_vs_adamw.csv` (one row per
evaluation of every run: optimizer, lr, adam_lr, step, tokens, eval_loss, best) and prints
the final losses. Runs live in `<workdir>/runs/<name>`, so an interrupted figure resumes.
`--smoke` runs a few steps at one LR each (for checking the script, not for reading).
"""

import csv
import os

import matplotlib
from absl import app, flags, logging

from composer_jax.parallel import backend
from composer_jax.train import loop, metrics, workdir_lock
from experiments.configs import default

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

ADAMW_LRS = (1e-3, 3e-3, 1e-2)
MUON_LRS = (3e-3, 1e-2, 3e-2)

_WORKDIR = flags.DEFINE_string("workdir", "workdir/muon_vs_adamw", "Output directory.")
_SMOKE = flags.DEFINE_bool("smoke", False, "A few steps at one LR each.")


def _config(smoke: bool, name: str, lr: float, adam_lr: float):
  c = default.get_config()
  c.optim.update(dict(name=name, lr=lr, adam_lr=adam_lr))
  if smoke:
    c.train.update(
      dict(steps=6, batch_size=4, seq_len=32, eval_every=3, eval_batches=1, log_every=3)
    )
    c.optim.warmup_steps = 2
  return c


def _sweep(workdir: str, smoke: bool, name: str, lrs, adam_lr=None) -> list[dict]:
  """Trains one run per LR; returns [{'optimizer', 'lr', 'adam_lr', 'evals': [...]}]."""
  runs = []
  for lr in lrs:
    a_lr = lr if adam_lr is None else adam_lr
    tag = f"{name}_lr{lr:g}_adam{a_lr:g}"
    run_dir = os.path.join(workdir, "runs", tag)
    loop.train(_config(smoke, name, lr, a_lr), run_dir)  # Resumes / skips a finished run.
    records = metrics.read_metrics(run_dir)
    evals = [(r["step"], r["tokens"], r["eval_loss"]) for r in records if "eval_loss" in r]
    runs.append({"optimizer": name, "lr": lr, "adam_lr": a_lr, "evals": evals})
    logging.info("%s: final eval loss %.4f", tag, evals[-1][2])
  return runs


def _best(runs):
  return min(runs, key=lambda r: r["evals"][-1][2])


def _write(workdir: str, runs: list[dict], best: list[dict]) -> None:
  with open(os.path.join(workdir, "muon_vs_adamw.csv"), "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["optimizer", "lr", "adam_lr", "step", "tokens", "eval_loss", "best"])
    for r in runs:
      for step, tokens, loss in r["evals"]:
        w.writerow(
          [
            r["optimizer"],
            r["lr"],
            r["adam_lr"],
            step,
            tokens,
            f"{loss:.6f}",
            int(any(r is b for b in best)),
          ]
        )
  fig, ax = plt.subplots(figsize=(6, 4))
  colors = {"muon": "tab:red", "adamw": "tab:blue"}
  for r in runs:
    is_best = any(r is b for b in best)
    _, tokens, losses = zip(*r["evals"])
    label = f"{r['optimizer']} lr={r['lr']:g}" + (" (best)" if is_best else "")
    ax.plot(
      tokens,
      losses,
      color=colors[r["optimizer"]],
      alpha=1.0 if is_best else 0.3,
      linewidth=2 if is_best else 1,
      label=label,
    )
  ax.set_xlabel("training tokens")
  ax.set_ylabel("validation loss (nats/token)")
  ax.set_title("tiny MoE: Muon vs AdamW, best LR of each")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(workdir, "muon_vs_adamw.png"), dpi=150)


def main(argv):
  del argv
  backend.ready_or_exit()
  with workdir_lock.held_or_exit(_WORKDIR.value):  # a second sweep here stops at once
    _figure(_WORKDIR.value, _SMOKE.value)


def _figure(workdir: str, smoke: bool):
  adamw = _sweep(workdir, smoke, "adamw", ADAMW_LRS[1:2] if smoke else ADAMW_LRS)
  best_adam_lr = _best(adamw)["lr"]
  muon = _sweep(workdir, smoke, "muon", MUON_LRS[1:2] if smoke else MUON_LRS, best_adam_lr)
  best = [_best(adamw), _best(muon)]
  _write(workdir, adamw + muon, best)
  for b in best:
    print(
      f"{b['optimizer']}: best lr {b['lr']:g} (adam_lr {b['adam_lr']:g}), final eval loss "
      f"{b['evals'][-1][2]:.4f} after {b['evals'][-1][1]:,} tokens"
    )
  print(f"wrote {workdir}/muon_vs_adamw.png and .csv")


if __name__ == "__main__":
  app.run(main)
