#!/usr/bin/env bash
# Multi-node `ddpdoctor check` with torchrun: run this same script on every node.
#
#   HEAD=node01 NNODES=2 NODE_RANK=0 ./examples/torchrun_check.sh    # on node01
#   HEAD=node01 NNODES=2 NODE_RANK=1 ./examples/torchrun_check.sh    # on node02
#
# Rank 0 (on the head node) prints the report and writes ddpdoctor-report.json; the exit code is 1 when a
# check failed. Export the same NCCL_*/GLOO_* variables here that your training job uses, so the doctor
# tests the configuration you actually run.
set -euo pipefail
HEAD=${HEAD:?set HEAD to the hostname of the first node}
NNODES=${NNODES:-2}
NODE_RANK=${NODE_RANK:?set NODE_RANK (0 on the head node)}
NPROC=${NPROC:-$({ nvidia-smi -L 2>/dev/null || true; } | wc -l | awk '{print ($1 > 0) ? $1 : 2}')}
PORT=${PORT:-29500}

exec torchrun --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$NPROC" \
    --master-addr "$HEAD" --master-port "$PORT" \
    -m ddpdoctor check --timeout "${TIMEOUT:-60}" --json ddpdoctor-report.json "$@"
