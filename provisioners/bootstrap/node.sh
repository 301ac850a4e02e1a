# ---- a node's part (after common.sh): join the overlay and Ray, then watch ----
# Close the public interface to all but WireGuard, join the overlay with the one-use token, start
# Ray on the overlay address with the node's labels and resources, then become the node's watcher.
step=firewall
if [ -z "$PUBLIC_IFACE" ]; then  # a real VM's: its default route's (ens5 on AWS's Nitro VMs)
  PUBLIC_IFACE=$(ip -o route show default | awk '{print $5; exit}')
  PUBLIC_IFACE=${PUBLIC_IFACE:-eth0}  # no default route: the first interface's name
  FIREWALL_RULES=${FIREWALL_RULES//@PUBLIC_IFACE@/$PUBLIC_IFACE}
fi
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
# (as a module: a venv made without pip has no console scripts). No log monitor: it would publish
# every line of the node's logs to drivers, and ours print none (logs -f reads the files)
"$VENV/bin/python" -m ray.scripts.scripts start --address="$RAY_ADDRESS" --node-ip-address="$overlay_ip" \
  --num-cpus="$NUM_CPUS" --num-gpus="$NUM_GPUS" --resources="$RESOURCES_JSON" \
  --labels="$LABELS" --object-store-memory="$OBJECT_STORE_BYTES" --disable-usage-stats \
  --temp-dir="$RAY_TEMP_DIR" --include-log-monitor=False

step=watch
say "ready; watching (controller grace ${GRACE_S} s, notices from $NOTICE_SOURCE)"
trap - ERR
exec "$VENV/bin/python" -m provisioners.bootstrap.watcher --state-dir "$NODE_DIR/overlay" \
  --grace-s "$GRACE_S" --notice-source "$NOTICE_SOURCE" --ray-address "$RAY_ADDRESS" \
  --shutdown-command "$SHUTDOWN_COMMAND"
