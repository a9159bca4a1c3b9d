#!/usr/bin/env bash
# Set up what LEGO-RL's sandboxes need on a Debian machine, as root. Idempotent: run it
# any number of times; every step checks before it acts.
#
#   1. apt packages: docker.io (engine) and debootstrap (base image).
#   2. dockerd (overlay2, no bridge, no iptables: containers only ever run with
#      --network none), started in the background unless one already answers `docker info`.
#      Per-container disk quotas do not come from the storage driver (XFS project quotas
#      need kernel quota support that e.g. Firecracker guests lack; btrfs qgroups made
#      container create/delete take tens of seconds under load): each sandbox's init puts
#      its writable layer on a size-limited tmpfs, as the local backend does.
#   3. the base image (debootstrap'd Debian + python3 + git), built once into the image
#      cache (LEGORL_CACHE, default ~/.cache/legorl/images) and imported into Docker, so
#      tests and runs only reuse it. Skip with LEGORL_SKIP_BASE=1.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
STATE="${LEGORL_STATE:-/var/lib/legorl}"
DATA_ROOT="$STATE/docker-root"
DOCKERD_LOG="${LEGORL_DOCKERD_LOG:-/var/log/legorl-dockerd.log}"

log() { echo "[setup_sandbox] $*" >&2; }

if [ "$(id -u)" != 0 ]; then
  log "must run as root (namespaces, cgroups, mounts and dockerd need it)"; exit 1
fi

# 1. packages -------------------------------------------------------------------------
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  apt-get update -qq
  for i in 1 2 3; do  # another apt may hold the lock for a while
    if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"; then break; fi
    [ "$i" = 3 ] && { log "apt-get install ${need[*]} failed"; exit 1; }
    sleep 10
  done
fi

# 2. dockerd --------------------------------------------------------------------------
mkdir -p "$STATE" "$DATA_ROOT"
if ! timeout 10 docker info >/dev/null 2>&1; then
  log "starting dockerd (data-root $DATA_ROOT, log $DOCKERD_LOG)"
  nohup setsid dockerd --data-root "$DATA_ROOT" --bridge=none --iptables=false --ip-masq=false \
    --storage-driver=overlay2 >>"$DOCKERD_LOG" 2>&1 </dev/null &
  for _ in $(seq 1 60); do
    timeout 5 docker info >/dev/null 2>&1 && break
    sleep 1
  done
  if ! timeout 10 docker info >/dev/null 2>&1; then
    log "dockerd did not come up; last lines of $DOCKERD_LOG:"; tail -20 "$DOCKERD_LOG" >&2; exit 1
  fi
fi

# 3. base image -----------------------------------------------------------------------
if [ "${LEGORL_SKIP_BASE:-0}" != 1 ]; then
  log "ensuring the base image (first time: debootstrap, a few minutes)"
  "$PY" -m legorl.sandbox.cli build --docker
fi
log "ok"
