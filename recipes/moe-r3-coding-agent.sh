#!/bin/bash
# rl360 recipe: a large MoE coding agent (Qwen3-235B-A22B) with routing replay (R3), trained with Miles.
#
#   R3: the engines return each token's routed experts and Megatron replays them, so the trainer
#   computes log-probs through the experts the sampler used. rl360's session servers collect the
#   routing rows turn by turn (delta R3: only the new positions of each turn) and merge them into
#   the trajectory's sample, so nothing is gathered through one manager at the step boundary.
#   N session servers run as Ray actors (--rl360-session-servers), each owning its trajectories.
#   Harbor starts sandboxes in rolling waves (--rolling-start-size per --rolling-start-interval),
#   so thousands of attempts do not pull their images at the same instant.
#   Every rl360 hook is wired, as in dense-8b-coding-agent.sh (the shared wiring is in
#   lib/rl360-common.sh).
#
# Sizing: 8 training nodes and 8 rollout nodes with 8 GPUs each; 64 tasks x 16 attempts = 1,024
# attempts per step. Set RL360_HARBOR_URL to a `rl360 harbor serve` on the sandbox fleet, or leave it
# unset to start one here.
#
#   DRY_RUN=1 recipes/moe-r3-coding-agent.sh    prints the Harbor and the train argv and starts nothing
#
# Deadlines (seconds): client deadline RL360_DEADLINE_S = 5400; Harbor spends at most 600 on the
# sandbox, 900 on the verifier and keeps 60 for its reply: agent budget 5400 - 600 - 900 - 60 =
# 3840 s < the 5400 s client deadline.

set -euo pipefail

MILES_MODEL=qwen3-235B-A22B
HF_CHECKPOINT=${HF_CHECKPOINT:-/root/Qwen3-235B-A22B}
REF_LOAD=${REF_LOAD:-/root/Qwen3-235B-A22B_torch_dist}
SAVE_DIR=${SAVE_DIR:-/root/Qwen3-235B-A22B_rl360}
RUN_DIR=${RUN_DIR:-/root/runs/qwen3-235b-a22b-rl360}
RL360_DEADLINE_S=${RL360_DEADLINE_S:-5400}
RL360_SESSION_SERVERS=${RL360_SESSION_SERVERS:-16}
SANDBOX_ENV=daytona
NUM_NODES=${NUM_NODES:-16}

# shellcheck source=lib/rl360-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/rl360-common.sh"

HARBOR_ARGS+=(
   --max-concurrent 2048
   # waves: at most 128 sandbox starts every 10 s
   --rolling-start-size 128
   --rolling-start-interval 10
   --env-setup-s 600
   --max-verifier-s 900
   --margin-s 60
)

ROLLOUT_ARGS+=(
   --num-rollout 300
   --rollout-batch-size 64
   --n-samples-per-prompt 16
   --over-sampling-batch-size 96
   --rollout-max-response-len 16384
   --global-batch-size 1024
)

GRPO_ARGS+=(
   # R3: engines return routed experts, the trainer replays them
   --use-rollout-routing-replay
)

OPTIMIZER_ARGS+=(
   --optimizer-cpu-offload
   --overlap-cpu-optimizer-d2h-h2d
   --use-precision-aware-optimizer
)

PERF_ARGS=(
   --tensor-model-parallel-size 4
   --sequence-parallel
   --pipeline-model-parallel-size 4
   --context-parallel-size 2
   --expert-model-parallel-size 16
   --expert-tensor-parallel-size 1
   --decoder-last-pipeline-num-layers 22
   --recompute-granularity full
   --recompute-method uniform
   --recompute-num-layers 1
   --use-dynamic-batch-size
   --max-tokens-per-gpu 16384
)

SGLANG_ARGS+=(
   --rollout-num-gpus-per-engine 32
   --sglang-mem-fraction-static 0.7
   --sglang-enable-dp-attention
   --sglang-dp-size 4
   --sglang-ep-size 32
   --sglang-enable-dp-lm-head
   --sglang-moe-a2a-backend deepep
   --sglang-deepep-mode auto
)

MISC_ARGS+=(
   --update-weight-buffer-size 4294967296
   --actor-num-nodes 8
   --actor-num-gpus-per-node 8
   --rollout-num-gpus 64
   --num-gpus-per-node 8
)

# this node heads the Ray cluster and waits for the other NUM_NODES - 1 to join
rl360_launch
