#!/bin/bash
# rl360 recipe: a dense 8B coding agent in the public run's shape, trained with Miles.
#
#   32 tasks x 8 attempts per step (256 attempts), one-step-off async (train_async.py: the next
#   rollout is generated while this step trains), GRPO without std normalization, TIS,
#   clip 0.2/0.28, KL coefficient 0, dynamic global batch size. Every rl360 hook is wired:
#   generate (session pool + Harbor /run), agent abort, valid-reward filter, valid-only group
#   baselines, honest rollout metrics, valid-sample loss reducer, valid-token TIS metrics.
#   The wiring all recipes share (hook flags, Harbor server, launch) is in lib/rl360-common.sh.
#
# Two nodes with 8 GPUs each: node 0 trains (Megatron), node 1 serves rollouts (SGLang behind the
# SMG gateway, policy manual = sticky per trajectory). Harbor sandboxes run wherever
# `rl360 harbor serve` runs: set RL360_HARBOR_URL to use a server you started on a sandbox host,
# or leave it unset and this script starts one here.
#
#   DRY_RUN=1 recipes/dense-8b-coding-agent.sh    prints the Harbor and the train argv, one per
#                                                 line, and starts nothing
#
# Deadlines (seconds): the client gives every attempt RL360_DEADLINE_S; the Harbor server spends
# at most --env-setup-s on the sandbox and --max-verifier-s on the verifier and keeps --margin-s
# for its reply, so the agent's budget is 3600 - 300 - 600 - 30 = 2670 s < the 3600 s client
# deadline: a slow agent is stopped and verified before the client gives up on it.

set -euo pipefail

MILES_MODEL=qwen3-8B
HF_CHECKPOINT=${HF_CHECKPOINT:-/root/Qwen3-8B}
REF_LOAD=${REF_LOAD:-/root/Qwen3-8B_torch_dist}
SAVE_DIR=${SAVE_DIR:-/root/Qwen3-8B_rl360}
RUN_DIR=${RUN_DIR:-/root/runs/qwen3-8b-rl360}
RL360_DEADLINE_S=${RL360_DEADLINE_S:-3600}
RL360_SESSION_SERVERS=${RL360_SESSION_SERVERS:-4}
SANDBOX_ENV=docker

# shellcheck source=lib/rl360-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/rl360-common.sh"

HARBOR_ARGS+=(
   # 256 attempts per step, 48 groups in flight with over-sampling: cap concurrent trials and start
   # sandboxes in waves so a step does not storm the image registry
   --max-concurrent 384
   --rolling-start-size 32
   --rolling-start-interval 2
   --env-setup-s 300
   --max-verifier-s 600
   --margin-s 30
)

ROLLOUT_ARGS+=(
   --num-rollout 200
   --rollout-batch-size 32
   --n-samples-per-prompt 8
   # spare groups so the valid-reward filter can drop groups and still fill 32
   --over-sampling-batch-size 48
   --rollout-max-response-len 8192
   --global-batch-size 256
)

PERF_ARGS=(
   --tensor-model-parallel-size 2
   --sequence-parallel
   --pipeline-model-parallel-size 1
   --context-parallel-size 2
   --recompute-granularity full
   --recompute-method uniform
   --recompute-num-layers 1
   --use-dynamic-batch-size
   --max-tokens-per-gpu 16384
)

SGLANG_ARGS+=(
   --rollout-num-gpus-per-engine 1
   --sglang-mem-fraction-static 0.8
)

MISC_ARGS+=(
   --actor-num-nodes 1
   --actor-num-gpus-per-node 8
   --rollout-num-gpus 8
)

# node 0 (this one) heads the Ray cluster; on node 1 run: ray start --address "${MASTER_ADDR}:6379" --num-gpus 8
rl360_launch
