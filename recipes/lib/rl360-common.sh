# rl360 recipes: the wiring every recipe in recipes/ shares. Sourced by a recipe, never run.
#
# Owns the defaults for paths and the Harbor server (MILES_DIR, MEGATRON_DIR, PROMPT_DATA,
# TASKS_ROOT, RL360_HARBOR_TOKEN, HARBOR_PORT, RL360_HARBOR_URL), the argv sections every recipe
# has in common (Harbor server basics, checkpoints, rollout data, the GRPO + TIS objective, the
# optimizer, every rl360 hook flag, the SMG router policy, dropout/precision), and the launch:
# DRY_RUN=1 prints the Harbor and the train argv, one per line, and starts nothing; otherwise it
# starts `rl360 harbor serve` here unless RL360_HARBOR_URL names one, heads the Ray cluster and
# submits Miles' train_async.py (one-step-off async) as a Ray job.
#
# The recipe sets, before sourcing: MILES_MODEL (the name Miles' model_args_utils.py knows),
# HF_CHECKPOINT, REF_LOAD, SAVE_DIR, RUN_DIR, RL360_DEADLINE_S, RL360_SESSION_SERVERS and
# SANDBOX_ENV (Harbor's --env). After sourcing it appends what differs (Harbor concurrency, sandbox
# waves and phase deadlines; rollout sizes; parallelism in PERF_ARGS; engine layout; node counts)
# to the arrays below and calls rl360_launch.

MILES_DIR=${MILES_DIR:-/root/miles}
MEGATRON_DIR=${MEGATRON_DIR:-/root/Megatron-LM}
PROMPT_DATA=${PROMPT_DATA:-/root/coding_tasks.jsonl}    # one row per Harbor task: {"prompt": ..., "metadata": {"task": "<dir under TASKS_ROOT>"}}
TASKS_ROOT=${TASKS_ROOT:-/root/harbor_tasks}
RL360_HARBOR_TOKEN=${RL360_HARBOR_TOKEN:-change-me}
HARBOR_PORT=${HARBOR_PORT:-11000}
RL360_HARBOR_URL=${RL360_HARBOR_URL:-}

MODEL_ARGS=()
if [ -f "${MILES_DIR}/miles/utils/external_utils/model_args_utils.py" ]; then
   MODEL_ARGS_LINE="$(python3 "${MILES_DIR}/miles/utils/external_utils/model_args_utils.py" "${MILES_MODEL}")"
   read -ra MODEL_ARGS <<< "${MODEL_ARGS_LINE}"
fi

# The recipe appends --max-concurrent, the sandbox waves and the phase deadlines (--env-setup-s,
# --max-verifier-s, --margin-s): the agent's budget is RL360_DEADLINE_S minus those three.
HARBOR_ARGS=(
   --host 0.0.0.0
   --port "${HARBOR_PORT}"
   --tasks-root "${TASKS_ROOT}"
   --env "${SANDBOX_ENV}"
   --agent terminus-2
   --token "${RL360_HARBOR_TOKEN}"
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
   --rollout-temperature 1.0
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

PERF_ARGS=()

SGLANG_ARGS=(
   # SMG gateway, manual policy: Miles gives every attempt a routing key, the session server sends
   # it as X-SMG-Routing-Key, so every turn of a trajectory hits the engine holding its prefix
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
   # Dr. GRPO instead: rl360_ext.train.reducers.constant_normalizer with RL360_PG_LOSS_CONSTANT=8192
   --custom-pg-loss-reducer-function-path rl360_ext.train.reducers.valid_sample_mean
   --custom-tis-function-path rl360_ext.train.tis.valid_token_tis
   # every weight push's path, reason, engines reached and calls per engine in Miles' step log
   --custom-megatron-init-path rl360_ext.weights.miles_observer.install
)

# The step gate (docs/gate.md): train, skip the update or stop, per step, from the rl360 metrics
# above. Needs patches/miles/0011 (these recipes use --use-dynamic-global-batch-size, whose metadata
# unpatched Miles does not hand a train-data hook; 0011 also lets train_async.py skip and stop), so it
# is on only with RL360_STEP_GATE=1; its bounds come from RL360_GATE_<FIELD> (StepGate, docs/gate.md).
if [ "${RL360_STEP_GATE:-0}" = "1" ]; then
   RL360_ARGS+=(--custom-convert-samples-to-train-data-path rl360_ext.gate.miles_hook.gated_train_data)
fi

MISC_ARGS=(
   --attention-dropout 0.0
   --hidden-dropout 0.0
   --accumulate-allreduce-grads-in-fp32
   --attention-softmax-in-fp32
   --attention-backend flash
)

# rl360_launch: print the argv (DRY_RUN=1) or start the Harbor server (unless RL360_HARBOR_URL is
# set), head the Ray cluster on this node and submit train_async.py. NUM_NODES, when set, is how
# many nodes the run waits for.
rl360_launch() {
   local train_argv=(
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
      printf '%s\n' "== harbor" "${HARBOR_ARGS[@]}" "== train" "${train_argv[@]}"
      return 0
   fi

   set -x
   export PYTHONUNBUFFERED=1
   mkdir -p "${RUN_DIR}"

   if [ -z "${RL360_HARBOR_URL}" ]; then
      rl360 harbor serve "${HARBOR_ARGS[@]}" > "${RUN_DIR}/harbor.log" 2>&1 &
      HARBOR_PID=$!
      trap 'kill "${HARBOR_PID}" 2>/dev/null || true' EXIT
   fi

   # this node heads the Ray cluster; on each other node run:
   #   ray start --address "${MASTER_ADDR}:6379" --num-gpus 8
   export MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
   ray start --head --node-ip-address "${MASTER_ADDR}" --num-gpus 8 --disable-usage-stats
   if [ -n "${NUM_NODES:-}" ]; then
      echo "waiting for ${NUM_NODES} nodes to join the Ray cluster"
   fi

   local runtime_env_json="{
  \"env_vars\": {
    \"PYTHONPATH\": \"${MEGATRON_DIR}\",
    \"CUDA_DEVICE_MAX_CONNECTIONS\": \"1\",
    \"RL360_HARBOR_TOKEN\": \"${RL360_HARBOR_TOKEN}\"
  }
}"

   cd "${MILES_DIR}"
   ray job submit --address="http://127.0.0.1:8265" \
      --runtime-env-json="${runtime_env_json}" \
      -- python3 train_async.py "${train_argv[@]}"
}
