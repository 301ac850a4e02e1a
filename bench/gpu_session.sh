#!/usr/bin/env bash
# What a lent one-GPU machine runs, from the repository root, with .whl carried:
#   bash bench/gpu_session.sh
# (device tool: run(command="bash bench/gpu_session.sh", carry=[".whl"], timeout_s=480)).
#
# .whl holds what the machine lacks or has in another version: ray-trim.tar.xz (Ray 2.60 for
# Python 3.12, trimmed), jsonschema and its needs, transformers 4.57.6 with huggingface_hub 0.36.0
# and tokenizers 0.22.2 (the machine's transformers 5.17 / hub 1.33 / tokenizers 0.23.2 are
# shadowed: /tmp/site comes first on PYTHONPATH; transformers 4.57.6 refuses tokenizers > 0.23.0).
#
# Parts, each under `timeout` and cut to what is left of TOTAL_S, each logged to $OUT; one
# failing does not stop the others:
#   (a) the GPU tests: a Hugging Face GPT-2 on CUDA in fp32 and bf16 against the CPU
#   (b) gpu_check's correctness rows (gpt-mini layouts, the HF GPT-2 in fp32 and bf16-mixed;
#       with NCCL=N, N>1, a DP N layout and the TP rows over NCCL too)
#   (c) fidelity of the HF GPT-2 with GPT-2 small's shape (fp32: the profiler measures fp32 only)
#   (d) fidelity of the built-in gpt2-small, same shape and batch as (c): the two side by side
#   (e) `submit recipes/quickstart.yaml` on the local cloud, whose nodes' GPUs are then this GPU
#   (f) `submit recipes/hf-gpt2-tp.yaml`: the HF GPT-2 as 2 stages x TP 2, a node preempted
# PARTS picks some (default: all) and their order, e.g. PARTS="pytest submit-quickstart submit-hf". While (e) and
# (f) run, nvidia-smi's compute processes are sampled every 2 s to $OUT/gpu-apps.log; each job's
# `started` events (which say what the workers compute on) are printed after it.
# $OUT gets 8 files at most (the device tool's limit): env.log, gpu-apps.log and per part
# NAME.log (+ NAME.json): run at most five parts at once, or three with reports.
# Expected on an H100: setup ~20 s, (a) ~45 s, (b) ~70 s, (c) ~40 s, (d) ~35 s.
set -u
cd "$(dirname "$0")/.." || exit 1

TOTAL_S=${TOTAL_S:-430} # all parts together, setup included (about 7 minutes)
KILL_AFTER_S=15         # after the SIGINT that `timeout` sends, SIGKILL this much later
RESERVE_S=5             # kept back for the last copies and the summary
LIMIT_PYTEST_S=90
LIMIT_CORRECTNESS_S=200 # 9 rows; the 2 TP rows share one GPU over gloo (~25 s each)
LIMIT_FIDELITY_HF_S=90
LIMIT_FIDELITY_BUILTIN_S=80
LIMIT_SUBMIT_S=150
PARTS=${PARTS:-pytest correctness fidelity-hf fidelity-builtin submit-quickstart submit-hf}
FIDELITY_BATCH="--microbatch 4 --global-batch 32" # BENCHMARKS.md's gpt2-small row
CHECK_FLAGS=""
NCCL=${NCCL:-0} # gpu_check --nccl (ranks of the NCCL rows; may exceed the GPUs)
HF_CONFIG=small-sized
BUILTIN_MODEL=gpt2-small
SETUP=1
# DRY_RUN=1: the same parts on this CPU machine, with the Python in hand (no wheels installed),
# tiny sizes, gpu_check on the CPU (the GPU tests skip themselves there)
if [[ ${DRY_RUN:-0} == 1 ]]; then
    FIDELITY_BATCH="" CHECK_FLAGS="--device cpu --quick" HF_CONFIG=test BUILTIN_MODEL=gpt-tiny
    SETUP=0
fi

CMD_PYTEST="python3 -m pytest -x -q tests/integration/test_gpu_runtime.py -p no:cacheprovider"
CHECK="python3 bench/gpu_check.py $CHECK_FLAGS --out /tmp/gc"
CMD_CORRECTNESS="$CHECK --skip fidelity --name correctness --nccl $NCCL"
CMD_FIDELITY_HF="$CHECK --skip correctness --model hf:gpt2 --hf-config $HF_CONFIG $FIDELITY_BATCH --name fidelity-hf"
CMD_FIDELITY_BUILTIN="$CHECK --skip correctness --model $BUILTIN_MODEL $FIDELITY_BATCH --name fidelity-$BUILTIN_MODEL"

OUT=${OUT:-/tmp/gpu-session-out}
START=$(date +%s)
mkdir -p "$OUT" /tmp/gc

rm -f /tmp/gc/*.json
{
    echo "== setup"
    if ((SETUP)); then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl
        tar -xJf .whl/ray-trim.tar.xz -C /tmp/site
    fi
} 2>&1 | tee "$OUT/env.log"
SITE=/tmp/site:
((SETUP)) || SITE=""
export PYTHONPATH=$SITE$PWD PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
{
    nvidia-smi -L
    python3 -c "import sys, torch, transformers, huggingface_hub, tokenizers, ray
print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda', torch.version.cuda,
      '| device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
print('transformers', transformers.__version__, transformers.__file__)
print('huggingface_hub', huggingface_hub.__version__, '| tokenizers', tokenizers.__version__,
      '| ray', ray.__version__, ray.__file__)"
    echo "setup took $(($(date +%s) - START)) s"
} 2>&1 | tee -a "$OUT/env.log"

SUMMARY=()

# part NAME LIMIT_S COMMAND: run COMMAND under `timeout` (its limit cut to what TOTAL_S leaves),
# its output to the screen and $OUT/NAME.log, its report (/tmp/gc/NAME.json) copied to $OUT
part() {
    local name=$1 limit=$2 command=$3
    local left=$((TOTAL_S - ($(date +%s) - START) - RESERVE_S - KILL_AFTER_S))
    if ((left < 20)); then
        SUMMARY+=("$name: not run (${left} s left of TOTAL_S=${TOTAL_S})")
        echo "== $name: not run, ${left} s left" | tee "$OUT/$name.log"
        return
    fi
    ((limit > left)) && limit=$left
    echo "== $name (limit ${limit} s): $command" | tee "$OUT/$name.log"
    local began=$(date +%s)
    # SIGINT first: Python's finally blocks run (the report is saved, Ray shut down)
    timeout -k "$KILL_AFTER_S" -s INT "$limit" $command 2>&1 | tee -a "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    local took=$(($(date +%s) - began))
    [[ -f /tmp/gc/$name.json ]] && cp "/tmp/gc/$name.json" "$OUT/$name.json"
    if ((SETUP && (rc == 124 || rc == 137))); then # on the lent machine only: all Ray is ours
        python3 -m ray.scripts.scripts stop --force >/dev/null 2>&1 # what the killed run left
    fi
    SUMMARY+=("$name: rc $rc in ${took} s")
    echo "== $name: rc $rc in ${took} s" | tee -a "$OUT/$name.log"
}

wanted() { [[ " $PARTS " == *" $1 "* ]]; }

# submit NAME RECIPE: a job on the local cloud, then its `started` events
submit() {
    local name=$1 recipe=$2
    part "$name" "$LIMIT_SUBMIT_S" "python3 -m orchestrator submit $recipe"
    python3 - "$recipe" <<'PY' 2>&1 | tee -a "$OUT/$1.log"
import json, os, sys
from pathlib import Path
name = Path(sys.argv[1]).stem
home = Path(os.environ.get("ORCHESTRATOR_HOME", Path.home() / ".orchestrator"))
for line in (home / "jobs" / name / "events.jsonl").open():
    event = json.loads(line)
    if event["event"] in ("started", "profiled", "preemption_notice", "recovered", "finished"):
        print(event["event"], "|", event["decision"], "|", event["reason"])
PY
}

if ((SETUP)) && { wanted submit-quickstart || wanted submit-hf; }; then
    (while sleep 2; do
        nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
    done) >"$OUT/gpu-apps.log" 2>&1 &
    SAMPLER=$!
fi
for name in $PARTS; do
    case $name in
    pytest) part pytest "$LIMIT_PYTEST_S" "$CMD_PYTEST" ;;
    correctness) part correctness "$LIMIT_CORRECTNESS_S" "$CMD_CORRECTNESS" ;;
    fidelity-hf) part fidelity-hf "$LIMIT_FIDELITY_HF_S" "$CMD_FIDELITY_HF" ;;
    fidelity-builtin) part "fidelity-$BUILTIN_MODEL" "$LIMIT_FIDELITY_BUILTIN_S" "$CMD_FIDELITY_BUILTIN" ;;
    submit-quickstart) submit submit-quickstart recipes/quickstart.yaml ;;
    submit-hf) submit submit-hf recipes/hf-gpt2-tp.yaml ;;
    *) echo "unknown part $name (pytest correctness fidelity-hf fidelity-builtin submit-quickstart submit-hf)" ;;
    esac
done
[[ -n ${SAMPLER:-} ]] && kill "$SAMPLER"

{
    echo "== summary (total $(($(date +%s) - START)) s)"
    printf '%s\n' "${SUMMARY[@]}"
    grep -h -E "max rel\. diff|FAILED|predicts|profiled on| passed| failed|skipped|^failed|Error" \
        "$OUT"/correctness.log "$OUT"/fidelity-*.log "$OUT"/pytest.log "$OUT"/submit-*.log 2>/dev/null |
        grep -v "^(pid" | tail -40
} 2>&1 | tee -a "$OUT/env.log"
