# ---- a job controller's part (after common.sh): run the controller program, then power off ----
# The program (orchestrator/driver/controller.py) runs in the foreground of this script. The VM's
# orderly shutdown sends this script SIGTERM: it is handed on to the program, which checkpoints
# and frees the job's nodes before it exits. When the program ends, the VM powers off (its cloud
# terminates it: the adapter launches with terminate-on-shutdown).
step=controller
mkdir -p "$JOBS_DIR"
for assignment in $CONTROLLER_ENV; do export "${assignment?}"; done
say "running the job's controller"
trap - ERR
set +e
"$VENV/bin/python" -m orchestrator.driver.controller --jobs-dir "$JOBS_DIR" $CONTROLLER_ARGS &
program=$!
trap 'kill -TERM "$program" 2>/dev/null' TERM INT
wait "$program"
code=$?
while kill -0 "$program" 2>/dev/null; do  # the wait a signal cut short
  wait "$program"
  code=$?
done
say "the controller exited with $code; powering off"
eval "$SHUTDOWN_COMMAND" || true
exit "$code"
