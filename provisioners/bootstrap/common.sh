# ---- the body of every VM's bootstrap, a node's and a controller's (script.py renders the header) ----
# Steps: log, the system's packages (WireGuard's tools, nftables, venv: only what is missing),
# install our package (the controller's versions: never "latest"). Any failed step prints
# GEO-BOOTSTRAP-FAILED with the log's last lines (the console the cloud shows) and shuts the VM
# down: a VM that cannot do its part is never left running.
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

step=packages
missing=()
command -v wg >/dev/null || missing+=(wireguard-tools)
command -v nft >/dev/null || missing+=(nftables)
command -v ip >/dev/null || missing+=(iproute2)
if [ "$INSTALL_MODE" = pip ] && ! "$PYTHON" -c 'import ensurepip' 2>/dev/null; then
  missing+=(python3-venv)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  say "installing ${missing[*]}"
  if command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
  else
    dnf install -y -q "${missing[@]/python3-venv/python3-pip}"
  fi
fi

step=install
say "installing $PACKAGE_WHEEL (ray $RAY_VERSION, torch $TORCH_VERSION) into $VENV"
wheel=$PACKAGE_WHEEL
if [[ "$wheel" == gs://* ]]; then  # the job's bucket, read with this VM's own service account
  wheel="$NODE_DIR/${PACKAGE_WHEEL##*/}"
  "$PYTHON" - "$PACKAGE_WHEEL" "$wheel" "${STORAGE_API:-https://storage.googleapis.com}" <<'PY'
import json, sys, urllib.parse, urllib.request
source, target, api = sys.argv[1:]
bucket, _, name = source[len("gs://"):].partition("/")
ask = urllib.request.Request(
    "http://169.254.169.254/computeMetadata/v1/instance/service-accounts/default/token",
    headers={"Metadata-Flavor": "Google"},
)
token = json.load(urllib.request.urlopen(ask, timeout=10))["access_token"]
url = f"{api}/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}?alt=media"
fetch = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
with urllib.request.urlopen(fetch, timeout=300) as reply, open(target, "wb") as out:
    out.write(reply.read())
PY
elif [[ "$wheel" == https://*.blob.core.windows.net/* ]]; then  # read with this VM's identity
  wheel="$NODE_DIR/${PACKAGE_WHEEL##*/}"
  "$PYTHON" - "$PACKAGE_WHEEL" "$wheel" <<'PY'
import json, sys, urllib.request
source, target = sys.argv[1:]
ask = urllib.request.Request(
    "http://169.254.169.254/metadata/identity/oauth2/token?api-version=2018-02-01"
    "&resource=https%3A%2F%2Fstorage.azure.com%2F",
    headers={"Metadata": "true"},
)
import time, urllib.error
# a role assigned a moment ago takes minutes to reach Blob Storage: 403 until then
deadline = time.monotonic() + 600
while True:
    token = json.load(urllib.request.urlopen(ask, timeout=10))["access_token"]
    fetch = urllib.request.Request(
        source, headers={"Authorization": f"Bearer {token}", "x-ms-version": "2021-12-02"}
    )
    try:
        with urllib.request.urlopen(fetch, timeout=300) as reply, open(target, "wb") as out:
            out.write(reply.read())
        break
    except urllib.error.HTTPError as error:
        if error.code != 403 or time.monotonic() > deadline:
            raise
    time.sleep(10)
PY
fi
case "$INSTALL_MODE" in
  local)
    # the local cloud: no download; the controller's Ray and torch are seen through a .pth file
    "$PYTHON" -m venv --without-pip "$VENV"
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    printf '%s\n' "${CONTROLLER_SITE//:/$'\n'}" >"$site/controller.pth"
    # our wheel is pure Python with neither scripts nor data: installed, it is its own files and
    # .dist-info in site-packages, which unpacking gives without pip's CPU-second start-up (each
    # VM of the local cloud boots on this machine's cores)
    "$VENV/bin/python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
      "$wheel" "$site"
    ;;
  pip)
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q "torch==$TORCH_VERSION" --index-url "$TORCH_INDEX_URL"
    "$VENV/bin/pip" install -q "ray[default]==$RAY_VERSION" "$wheel"
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
    # a local version label (torch's +cpu, +cu126) is the build, not the release
    assert have.split("+")[0] == want.split("+")[0], f"{name} {have} installed, the controller runs {want}"
EOF

