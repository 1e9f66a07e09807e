#!/usr/bin/env bash
# Diagnose a hung multi-node DDP job under SLURM with `ddpdoctor stacks`.
#
# Run this from a login node (or inside the job's allocation) while the job hangs:
#
#     examples/stacks_slurm.sh JOBID [OUTDIR]
#
# Step 1 runs one `ddpdoctor stacks` per node of the job (an extra job step on the same nodes; with
# --overlap it shares the job's CPUs, so it runs even when the training step holds them all). Each node
# finds its own ranks by their environment (SLURM_JOB_ID/SLURM_STEP_ID, or torchrun's TORCHELASTIC_RUN_ID
# when srun starts torchrun per node), dumps them with py-spy in parallel and writes OUTDIR/<host>.json.
# Step 2 merges the files: ranks are grouped across nodes, and the rank that is somewhere else is named,
# e.g. "rank 13 is in barrier() at train.py:80; ranks 0-12,14,15 are in all_reduce() at train.py:55".
#
# If py-spy is not permitted on the compute nodes (kernel.yama.ptrace_scope, containers without
# SYS_PTRACE), add `import ddpdoctor; ddpdoctor.install_stack_dumps()` to the training script and add
# --signal below: each rank then dumps its own stacks on SIGUSR1, no ptrace needed.
#
# The training job itself is launched as usual, for example:
#     srun --nodes 4 --ntasks-per-node 1 torchrun --nnodes 4 --nproc-per-node 8 \
#          --rdzv-backend c10d --rdzv-endpoint "$(hostname):29500" --rdzv-id "$SLURM_JOB_ID" train.py
set -euo pipefail

job="${1:?usage: $0 JOBID [OUTDIR]}"
out="${2:-ddpdoctor-stacks-$job}"
mkdir -p "$out"
nodes="$(squeue -h -j "$job" -o %D)"

# One task per node of the job; `--job` keeps each node to this job's ranks (a node may run several jobs).
# Exit code 1 only means "the ranks disagree", which is what we came to find, so it does not stop us.
srun --jobid "$job" --overlap --nodes "$nodes" --ntasks-per-node 1 \
    bash -c "ddpdoctor stacks --job '$job' --json '$out'/\$(hostname).json > '$out'/\$(hostname).txt 2>&1 || [ \$? -eq 1 ]"

ddpdoctor stacks merge "$out"/*.json --json "$out/merged.json"
