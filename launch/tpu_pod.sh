#!/usr/bin/env bash
# TPU pod launcher: `python -m experiments.run` on every worker of a Cloud TPU VM slice.
#
#   launch/tpu_pod.sh TPU_NAME ZONE [experiments.run args...]
#   SETUP=1 launch/tpu_pod.sh my-v5p-64 us-east5-a \
#       --config=experiments/configs/kimi_k2_continued.py --workdir=/mnt/shared/k2
#
# One process per worker drives that worker's chips (`gcloud compute tpus tpu-vm ssh
# --worker=all`). No coordinator flags are passed: on a TPU VM `jax.distributed.initialize()`
# asks the metadata server for the worker list and this worker's index
# (`composer_jax.parallel.distributed`). Arguments are quoted for the remote shell and go to
# `experiments.run` unchanged. --workdir must be storage all workers share (Filestore/NFS or a
# gcsfuse mount; each process writes its own checkpoint shards).
#
# Environment: SETUP=1 first copies the committed tree (git archive HEAD) to REMOTE_DIR on
# every worker and installs it (`pip install -e '.[tpu]'` in REMOTE_DIR/.venv); REMOTE_DIR
# (default composer_jax, relative to the remote home); GCLOUD (default gcloud); the gcloud
# project is gcloud's (CLOUDSDK_CORE_PROJECT to override).

set -euo pipefail
if (($# < 2)); then
  echo "usage: $0 TPU_NAME ZONE [experiments.run args...]" >&2
  exit 2
fi
name=$1 zone=$2
shift 2
remote_dir=${REMOTE_DIR:-composer_jax}
read -r -a gcloud <<<"${GCLOUD:-gcloud}"
tpu=("${gcloud[@]}" compute tpus tpu-vm)

if [[ ${SETUP:-0} == 1 ]]; then
  archive=$(mktemp --suffix=.tar.gz)
  trap 'rm -f "$archive"' EXIT
  git -C "$(dirname "$0")/.." archive --format=tar.gz -o "$archive" HEAD
  "${tpu[@]}" scp "$archive" "$name:composer_jax.tar.gz" --zone="$zone" --worker=all
  "${tpu[@]}" ssh "$name" --zone="$zone" --worker=all --command="set -e; \
mkdir -p $(printf %q "$remote_dir") && cd $(printf %q "$remote_dir") && \
tar xzf ~/composer_jax.tar.gz && python3 -m venv .venv && .venv/bin/pip install -q -e '.[tpu]'"
fi

"${tpu[@]}" ssh "$name" --zone="$zone" --worker=all --command="cd $(printf %q "$remote_dir") && \
.venv/bin/python -m experiments.run $(printf '%q ' "$@")"
