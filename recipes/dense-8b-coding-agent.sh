#!/bin/bash
# rl360 recipe: a dense 8B coding agent in the public run's shape, trained with Miles.
#
#   32 tasks x 8 attempts per step (256 attempts), one-step-off async (train_async.py: the next
#   rollout is generated while this step trains), GRPO without std normalization, TIS,
#   clip 0.2/0.28, KL coefficient 0, dynamic global batch size. Every rl360 hook is wired:
#   generate (session pool + Harbor /run), agent abort, valid-reward filter, valid-only group
#   baselines, honest rollout metrics, valid-sample loss reducer, valid-token TIS metrics.
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

MILES_DIR=${MILES_DIR:-/root/miles}
MEGATRON_DIR=${MEGATRON_DIR:-/root/Megatron-LM}
HF_CHECKPOINT=${HF_CHECKPOINT:-/root/Qwen3-8B}
REF_LOAD=${REF_LOAD:-/root/Qwen3-8B_torch_dist}
SAVE_DIR=${SAVE_DIR:-/root/Qwen3-8B_rl360}
PROMPT_DATA=${PROMPT_DATA:-/root/coding_tasks.jsonl}    # one row per Harbor task: {"prompt": ..., "metadata": {"task": "<dir under TASKS_ROOT>"}}
TASKS_ROOT=${TASKS_ROOT:-/root/harbor_tasks}
RUN_DIR=${RUN_DIR:-/root/runs/qwen3-8b-rl360}
RL360_HARBOR_TOKEN=${RL360_HARBOR_TOKEN:-change-me}
RL360_DEADLINE_S=${RL360_DEADLINE_S:-3600}
HARBOR_PORT=${HARBOR_PORT:-11000}
RL360_HARBOR_URL=${RL360_HARBOR_URL:-}

MODEL_ARGS=()
if [ -f "${MILES_DIR}/miles/utils/external_utils/model_args_utils.py" ]; then
   MODEL_ARGS_LINE="$(python3 "${MILES_DIR}/miles/utils/external_utils/model_args_utils.py" "qwen3-8B")"
   read -ra MODEL_ARGS <<< "${MODEL_ARGS_LINE}"
fi

HARBOR_ARGS=(
   --host 0.0.0.0
   --port "${HARBOR_PORT}"
   --tasks-root "${TASKS_ROOT}"
   --env docker
   --agent terminus-2
   --token "${RL360_HARBOR_TOKEN}"
   # 256 attempts per step, 48 groups in flight with over-sampling: cap concurrent trials and start
   # sandboxes in waves so a step does not storm the image registry
   --max-concurrent 384
   --rolling-start-size 32
   --rolling-start-interval 2
   --env-setup-s 300
   --max-verifier-s 600
   --margin-s 30
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
   --num-rollout 200
   --rollout-batch-size 32
   --n-samples-per-prompt 8
   # spare groups so the valid-reward filter can drop groups and still fill 32
   --over-sampling-batch-size 48
   --rollout-max-response-len 8192
   --rollout-temperature 1.0
   --global-batch-size 256
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
)

OPTIMIZER_ARGS=(
   --optimizer adam
   --lr 1e-6
   --lr-decay-style constant
   --weight-decay 0.1
   --adam-beta1 0.9
   --adam-beta2 0.98
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

SGLANG_ARGS=(
   --rollout-num-gpus-per-engine 1
   --sglang-mem-fraction-static 0.8
   # SMG gateway, manual policy: Miles gives every attempt a routing key, the session server sends
   # it as X-SMG-Routing-Key, so every turn of a trajectory hits the engine holding its prefix
   --sglang-router-policy manual
)

RL360_ARGS=(
   --custom-generate-function-path rl360_ext.rollout.generate.generate
   --custom-agent-function-path rl360_ext.rollout.agent.run
   --rl360-harbor-url "${RL360_HARBOR_URL:-http://127.0.0.1:${HARBOR_PORT}}"
   --rl360-harbor-token "${RL360_HARBOR_TOKEN}"
   --rl360-session-servers 4
   --rl360-deadline-s "${RL360_DEADLINE_S}"
   --rl360-agent-timeout-policy score
   --rl360-metrics-path "${RUN_DIR}/rl360-metrics.jsonl"
   --dynamic-sampling-filter-path rl360_ext.rollout.filters.check_valid_reward_nonzero_std
   --custom-reward-post-process-path rl360_ext.rollout.rewards.valid_group_advantages
   --custom-rollout-log-function-path rl360_ext.rollout.metrics.log_rollout_metrics
   # Dr. GRPO instead: rl360_ext.train.reducers.constant_normalizer with RL360_PG_LOSS_CONSTANT=8192
   --custom-pg-loss-reducer-function-path rl360_ext.train.reducers.valid_sample_mean
   --custom-tis-function-path rl360_ext.train.tis.valid_token_tis
)

MISC_ARGS=(
   --attention-dropout 0.0
   --hidden-dropout 0.0
   --accumulate-allreduce-grads-in-fp32
   --attention-softmax-in-fp32
   --attention-backend flash
   --actor-num-nodes 1
   --actor-num-gpus-per-node 8
   --rollout-num-gpus 8
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

# node 0 (this one) heads the Ray cluster; on node 1 run: ray start --address "${MASTER_ADDR}:6379" --num-gpus 8
export MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
ray start --head --node-ip-address "${MASTER_ADDR}" --num-gpus 8 --disable-usage-stats

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
