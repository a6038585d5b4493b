"""Projected sharded-Muon optimizer step time for Kimi K2 (1.03T parameters) on N GPUs.

    python -m experiments.figures.optimizer_step_cost --out /tmp/optimizer_step_cost

Writes to --out:
  matrices.csv  one row per Muon parameter: count of [fan_in, fan_out] matrices,
                NS FLOPs and all-to-all bytes per matrix (`composer_jax.optim.muon_cost`);
  step_cost.csv one row per GPU count N: per-device NS FLOPs and all-to-all bytes,
                compute / communication / projected step seconds;
  layouts.csv   devices each named layout needs: dual view vs one shared mesh;
  optimizer_step_cost.png  step time vs N, with the report's 0.2 s line.

Model (see `muon_cost.step_cost`): dense view HSDP with FSDP inside a node, expert
view over all N GPUs; NS time = busiest GPU's FLOPs / (peak * efficiency);
all-to-all time = bytes / link bandwidth (NVLink inside a node for the dense view,
the per-GPU InfiniBand NIC for experts). Defaults: 989 TFLOP/s = H100/H200 SXM
dense bf16 tensor-core peak (the H200 differs only in HBM, which compute-bound NS
does not use, so both cards give the same curve; pass 494.5 for TF32), NVLink 450
GB/s per direction, 400 Gb/s = 50 GB/s NIC per GPU, bf16 transfers.
"""

import csv
import os

from absl import app, flags, logging

from composer_jax.parallel import backend

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "/tmp/optimizer_step_cost", "Output directory.")
flags.DEFINE_string("preset", "kimi_k2", "Model preset.")
flags.DEFINE_list("devices", ["64", "128", "192", "384", "768", "1536", "3072"], "GPU counts N.")
flags.DEFINE_float("peak_tflops", 989.0, "Per-GPU matmul peak, TFLOP/s (989 bf16, 494.5 TF32).")
flags.DEFINE_float("efficiency", 0.5, "Achieved fraction of peak in batched NS matmuls.")
flags.DEFINE_float("nvlink_gbps", 450.0, "Intra-node bandwidth per GPU and direction, GB/s.")
flags.DEFINE_float("ib_gbps", 50.0, "Inter-node bandwidth per GPU and direction, GB/s.")
flags.DEFINE_integer("node", 8, "GPUs per node (the dense view's FSDP width).")
flags.DEFINE_integer("ns_steps", 5, "Newton-Schulz iterations.")
flags.DEFINE_integer("bytes_per_elem", 2, "Bytes per transferred element (2 = bf16).")
flags.DEFINE_float("target_s", 0.2, "Reported optimizer step time for a 1T model, seconds.")


def _write(path, rows):
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)


def main(argv):
  del argv
  backend.ready_or_exit()
  import jax
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from composer_jax.model import transformer
  from composer_jax.model.config import get_preset
  from composer_jax.optim import muon_cost
  from composer_jax.parallel.mesh import DENSE_AXES, EXPERT_AXES, resolve_sizes
  from experiments.configs import layouts

  os.makedirs(FLAGS.out, exist_ok=True)
  cfg = get_preset(FLAGS.preset)
  shapes = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))["params"]
  mats = muon_cost.muon_matrices(transformer.logical_axes(cfg)["params"], shapes)
  _write(
    os.path.join(FLAGS.out, "matrices.csv"),
    [
      dict(
        path=m.path,
        view=m.view,
        count=m.count,
        fan_in=m.fan_in,
        fan_out=m.fan_out,
        ns_flops_per_matrix=muon_cost.ns_flops(m.fan_in, m.fan_out, FLAGS.ns_steps),
        total_ns_flops=m.count * muon_cost.ns_flops(m.fan_in, m.fan_out, FLAGS.ns_steps),
      )
      for m in mats
    ],
  )
  total = sum(m.count * muon_cost.ns_flops(m.fan_in, m.fan_out, FLAGS.ns_steps) for m in mats)

  rows = []
  for n in map(int, FLAGS.devices):
    c = muon_cost.step_cost(
      mats,
      n,
      node=FLAGS.node,
      n_experts=cfg.n_routed_experts,
      peak_flops=FLAGS.peak_tflops * 1e12,
      efficiency=FLAGS.efficiency,
      intra_bw=FLAGS.nvlink_gbps * 1e9,
      inter_bw=FLAGS.ib_gbps * 1e9,
      steps=FLAGS.ns_steps,
      bytes_per_elem=FLAGS.bytes_per_elem,
    )
    rows.append(
      dict(
        devices=n,
        total_ns_flops=total,
        dense_flops_per_device=c.dense_flops,
        expert_flops_per_device=c.expert_flops,
        dense_a2a_bytes_per_device=c.dense_bytes,
        expert_a2a_bytes_per_device=c.expert_bytes,
        compute_s=c.compute_s,
        comm_s=c.comm_s,
        overlapped_s=c.overlapped_s,
        serial_s=c.serial_s,
      )
    )
  _write(os.path.join(FLAGS.out, "step_cost.csv"), rows)

  lay_rows = []
  for name in layouts.LAYOUTS:
    mesh = layouts.get_config(name).mesh
    dense = dict(zip(DENSE_AXES, resolve_sizes(mesh, DENSE_AXES, 8)))
    expert = dict(zip(EXPERT_AXES, resolve_sizes(mesh, EXPERT_AXES, 8)))
    lay_rows.append(
      dict(
        layout=name,
        **dense,
        **expert,
        dual_view_devices=8,
        shared_mesh_devices=muon_cost.shared_mesh_devices(dense, expert),
      )
    )
  _write(os.path.join(FLAGS.out, "layouts.csv"), lay_rows)

  ns = [r["devices"] for r in rows]
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  for key, label in [
    ("compute_s", "Newton–Schulz compute"),
    ("comm_s", "all-to-all"),
    ("overlapped_s", "step, comm overlapped"),
    ("serial_s", "step, no overlap"),
  ]:
    ax.plot(ns, [r[key] for r in rows], marker="o", label=label)
  ax.axhline(FLAGS.target_s, color="k", ls="--", lw=1, label=f"reported {FLAGS.target_s} s")
  ax.set(
    xscale="log",
    yscale="log",
    xlabel="GPUs (H100 or H200)",
    ylabel="seconds per step",
    title=f"Sharded Muon step, {FLAGS.preset} ({total / 1e15:.1f} PFLOP NS), "
    f"{FLAGS.efficiency:.0%} of {FLAGS.peak_tflops:g} TFLOP/s",
  )
  ax.set_xticks(ns, [str(n) for n in ns])
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(FLAGS.out, "optimizer_step_cost.png"), dpi=120)

  ok = [r["devices"] for r in rows if r["overlapped_s"] <= FLAGS.target_s]
  for r in rows:
    logging.info(
      "N=%d compute %.3fs comm %.3fs step %.3fs",
      r["devices"],
      r["compute_s"],
      r["comm_s"],
      r["overlapped_s"],
    )
  print(
    f"total NS {total:.4g} FLOP/step; {FLAGS.target_s} s reached from N="
    f"{ok[0] if ok else 'none of ' + str(ns)} GPUs; wrote {FLAGS.out}"
  )


if __name__ == "__main__":
  app.run(main)
