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
#   Every rl360 hook is wired, as in dense-8b-coding-agent.sh.
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

MILES_DIR=${MILES_DIR:-/root/miles}
MEGATRON_DIR=${MEGATRON_DIR:-/root/Megatron-LM}
HF_CHECKPOINT=${HF_CHECKPOINT:-/root/Qwen3-235B-A22B}
REF_LOAD=${REF_LOAD:-/root/Qwen3-235B-A22B_torch_dist}
SAVE_DIR=${SAVE_DIR:-/root/Qwen3-235B-A22B_rl360}
PROMPT_DATA=${PROMPT_DATA:-/root/coding_tasks.jsonl}    # one row per Harbor task: {"prompt": ..., "metadata": {"task": "<dir under TASKS_ROOT>"}}
TASKS_ROOT=${TASKS_ROOT:-/root/harbor_tasks}
RUN_DIR=${RUN_DIR:-/root/runs/qwen3-235b-a22b-rl360}
RL360_HARBOR_TOKEN=${RL360_HARBOR_TOKEN:-change-me}
RL360_DEADLINE_S=${RL360_DEADLINE_S:-5400}
RL360_SESSION_SERVERS=${RL360_SESSION_SERVERS:-16}
HARBOR_PORT=${HARBOR_PORT:-11000}
RL360_HARBOR_URL=${RL360_HARBOR_URL:-}
NUM_NODES=${NUM_NODES:-16}

MODEL_ARGS=()
if [ -f "${MILES_DIR}/miles/utils/external_utils/model_args_utils.py" ]; then
   MODEL_ARGS_LINE="$(python3 "${MILES_DIR}/miles/utils/external_utils/model_args_utils.py" "qwen3-235B-A22B")"
   read -ra MODEL_ARGS <<< "${MODEL_ARGS_LINE}"
fi

HARBOR_ARGS=(
   --host 0.0.0.0
   --port "${HARBOR_PORT}"
   --tasks-root "${TASKS_ROOT}"
   --env daytona
   --agent terminus-2
   --token "${RL360_HARBOR_TOKEN}"
   --max-concurrent 2048
   # waves: at most 128 sandbox starts every 10 s
   --rolling-start-size 128
   --rolling-start-interval 10
   --env-setup-s 600
   --max-verifier-s 900
   --margin-s 60
)

CKPT_ARGS=(
   --hf-checkpoint "${HF_CHECKPOINT}"
   --ref-load "${REF_LOAD}"
   --save "${SAVE_DIR}"
   --save-interval 20
)

ROLLOUT_ARGS=(
   --prompt-data "${PROMPT_DATA}"
   --input-key prompt
   --metadata-key metadata
   --rollout-shuffle
   --num-rollout 300
   --rollout-batch-size 64
   --n-samples-per-prompt 16
   --over-sampling-batch-size 96
   --rollout-max-response-len 16384
   --rollout-temperature 1.0
   --global-batch-size 1024
   --use-dynamic-global-batch-size
   --save-debug-rollout-data "${RUN_DIR}/rollout/{rollout_id}.pt"
)

GRPO_ARGS=(
   --advantage-estimator grpo
   --disable-grpo-std-normalization
   --kl-loss-coef 0
   --entropy-coef 0
   --eps-clip 0.2
   --eps-clip-high 0.28
   --use-tis
   --tis-clip 2.0
   --tis-clip-low 0
   # R3: engines return routed experts, the trainer replays them
   --use-rollout-routing-replay
)

OPTIMIZER_ARGS=(
   --optimizer adam
   --lr 1e-6
   --lr-decay-style constant
   --weight-decay 0.1
   --adam-beta1 0.9
   --adam-beta2 0.98
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

SGLANG_ARGS=(
   --rollout-num-gpus-per-engine 32
   --sglang-mem-fraction-static 0.7
   --sglang-enable-dp-attention
   --sglang-dp-size 4
   --sglang-ep-size 32
   --sglang-enable-dp-lm-head
   --sglang-moe-a2a-backend deepep
   --sglang-deepep-mode auto
   # SMG gateway, manual policy: sticky routing per trajectory (X-SMG-Routing-Key)
   --sglang-router-policy manual
)

RL360_ARGS=(
   --custom-generate-function-path rl360_ext.rollout.generate.generate
   --custom-agent-function-path rl360_ext.rollout.agent.run
   --rl360-harbor-url "${RL360_HARBOR_URL:-http://127.0.0.1:${HARBOR_PORT}}"
   --rl360-harbor-token "${RL360_HARBOR_TOKEN}"
   --rl360-session-servers "${RL360_SESSION_SERVERS}"
   --rl360-deadline-s "${RL360_DEADLINE_S}"
   --rl360-agent-timeout-policy score
   --rl360-metrics-path "${RUN_DIR}/rl360-metrics.jsonl"
   --dynamic-sampling-filter-path rl360_ext.rollout.filters.check_valid_reward_nonzero_std
   --custom-reward-post-process-path rl360_ext.rollout.rewards.valid_group_advantages
   --custom-rollout-log-function-path rl360_ext.rollout.metrics.log_rollout_metrics
   --custom-pg-loss-reducer-function-path rl360_ext.train.reducers.valid_sample_mean
   --custom-tis-function-path rl360_ext.train.tis.valid_token_tis
)

MISC_ARGS=(
   --attention-dropout 0.0
   --hidden-dropout 0.0
   --accumulate-allreduce-grads-in-fp32
   --attention-softmax-in-fp32
   --attention-backend flash
   --update-weight-buffer-size 4294967296
   --actor-num-nodes 8
   --actor-num-gpus-per-node 8
   --rollout-num-gpus 64
   --num-gpus-per-node 8
)

TRAIN_ARGV=(
   "${MODEL_ARGS[@]}"
   "${CKPT_ARGS[@]}"
   "${ROLLOUT_ARGS[@]}"
   "${GRPO_ARGS[@]}"
   "${OPTIMIZER_ARGS[@]}"
   "${PERF_ARGS[@]}"
   "${SGLANG_ARGS[@]}"
   "${RL360_ARGS[@]}"
   "${MISC_ARGS[@]}"
)

if [ -n "${DRY_RUN:-}" ]; then
   printf '%s\n' "== harbor" "${HARBOR_ARGS[@]}" "== train" "${TRAIN_ARGV[@]}"
   exit 0
fi

set -x
export PYTHONUNBUFFERED=1
mkdir -p "${RUN_DIR}"

if [ -z "${RL360_HARBOR_URL}" ]; then
   rl360 harbor serve "${HARBOR_ARGS[@]}" > "${RUN_DIR}/harbor.log" 2>&1 &
   HARBOR_PID=$!
   trap 'kill "${HARBOR_PID}" 2>/dev/null || true' EXIT
fi

# this node heads the Ray cluster; on each of the other NUM_NODES - 1 nodes run:
#   ray start --address "${MASTER_ADDR}:6379" --num-gpus 8
export MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
ray start --head --node-ip-address "${MASTER_ADDR}" --num-gpus 8 --disable-usage-stats
echo "waiting for ${NUM_NODES} nodes to join the Ray cluster"

RUNTIME_ENV_JSON="{
  \"env_vars\": {
    \"PYTHONPATH\": \"${MEGATRON_DIR}\",
    \"CUDA_DEVICE_MAX_CONNECTIONS\": \"1\",
    \"RL360_HARBOR_TOKEN\": \"${RL360_HARBOR_TOKEN}\"
  }
}"

cd "${MILES_DIR}"
ray job submit --address="http://127.0.0.1:8265" \
   --runtime-env-json="${RUNTIME_ENV_JSON}" \
   -- python3 train_async.py "${TRAIN_ARGV[@]}"
