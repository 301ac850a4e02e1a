# ---- the body of every node's bootstrap (provisioners/bootstrap/script.py renders the header) ----
# Steps: log, install (the controller's versions: never "latest"), close the public interface to
# all but WireGuard, join the overlay with the one-use token, start Ray on the overlay address
# with the node's labels and resources, then become the node's watcher. Any failed step prints
# GEO-BOOTSTRAP-FAILED with the log's last lines (the console the cloud shows) and shuts the node
# down: a node that cannot join is never left running.
set -Eeuo pipefail
umask 077
mkdir -p "$NODE_DIR"
exec >>"$LOG_FILE" 2>&1
if [ -n "${CONSOLE:-}" ] && [ -w "$CONSOLE" ]; then
  exec > >(tee -a "$CONSOLE") 2>&1
fi

step=start
fail() {
  local code=$?
  trap - ERR
  echo "GEO-BOOTSTRAP-FAILED node=$NODE step=$step exit=$code"
  tail -n "$TAIL_LINES" "$LOG_FILE" | grep -v GEO-BOOTSTRAP-FAILED || true
  eval "$SHUTDOWN_COMMAND" || true
  exit "$code"
}
trap fail ERR
say() { echo "$(date -u +%H:%M:%S) bootstrap[$NODE] $*"; }

step=install
say "installing $PACKAGE_WHEEL (ray $RAY_VERSION, torch $TORCH_VERSION) into $VENV"
case "$INSTALL_MODE" in
  local)
    # the local cloud: no download; the controller's Ray and torch are seen through a .pth file
    "$PYTHON" -m venv --without-pip "$VENV"
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    printf '%s\n' "${CONTROLLER_SITE//:/$'\n'}" >"$site/controller.pth"
    "$PYTHON" -m pip --python "$VENV/bin/python" install -q --no-deps --no-index "$PACKAGE_WHEEL"
    ;;
  pip)
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q "torch==$TORCH_VERSION" --index-url "$TORCH_INDEX_URL"
    "$VENV/bin/pip" install -q "ray[default]==$RAY_VERSION" "$PACKAGE_WHEEL"
    ;;
  *)
    echo "unknown INSTALL_MODE $INSTALL_MODE"
    false
    ;;
esac
# the versions as installed (read from their metadata: importing torch would cost seconds)
"$VENV/bin/python" - <<EOF
import importlib.metadata as m
for name, want in (("geo-orchestrator", "$PACKAGE_VERSION"), ("ray", "$RAY_VERSION"),
                   ("torch", "$TORCH_VERSION")):
    have = m.version(name)
    assert have == want, f"{name} {have} installed, the controller runs {want}"
EOF

step=firewall
say "public interface $PUBLIC_IFACE: only UDP $WG_PORT in"
printf '%s' "$FIREWALL_RULES" | nft -f -

step=overlay
say "joining the overlay"
token_file="$NODE_DIR/join.token"
printf '%s' "$JOIN_TOKEN" >"$token_file"
JOIN_TOKEN=""
overlay_ip=$("$VENV/bin/python" -m provisioners.overlay.node join \
  --token-file "$token_file" --state-dir "$NODE_DIR/overlay" --timeout-s "$JOIN_TIMEOUT_S")
interface=$("$VENV/bin/python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["interface"])' \
  "$NODE_DIR/overlay/node.json")
say "overlay address $overlay_ip on $interface"

step=ray
# Ray and the collectives bind to the overlay: gloo and NCCL pick the WireGuard interface
export GLOO_SOCKET_IFNAME="$interface" NCCL_SOCKET_IFNAME="$interface"
for assignment in $RAY_ENV; do export "${assignment?}"; done
say "ray start --address=$RAY_ADDRESS as $overlay_ip"
# (as a module: a venv made without pip has no console scripts)
"$VENV/bin/python" -m ray.scripts.scripts start --address="$RAY_ADDRESS" --node-ip-address="$overlay_ip" \
  --num-cpus="$NUM_CPUS" --num-gpus="$NUM_GPUS" --resources="$RESOURCES_JSON" \
  --labels="$LABELS" --object-store-memory="$OBJECT_STORE_BYTES" --disable-usage-stats \
  --temp-dir="$RAY_TEMP_DIR"

step=watch
say "ready; watching (controller grace ${GRACE_S} s, notices from $NOTICE_SOURCE)"
trap - ERR
exec "$VENV/bin/python" -m provisioners.bootstrap.watcher --state-dir "$NODE_DIR/overlay" \
  --grace-s "$GRACE_S" --notice-source "$NOTICE_SOURCE" --ray-address "$RAY_ADDRESS" \
  --shutdown-command "$SHUTDOWN_COMMAND"
