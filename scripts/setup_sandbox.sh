#!/usr/bin/env bash
# Set up what LEGO-RL's sandboxes need on a Debian machine, as root. Idempotent: run it
# any number of times; every step checks before it acts.
#
#   1. apt packages: docker.io (engine), debootstrap (base image), btrfs-progs (quotas).
#   2. a btrfs filesystem with quotas (a sparse loop file) as Docker's data-root, so
#      `docker run --storage-opt size=…` can cap a container's disk (the btrfs storage
#      driver enforces it with qgroups; XFS project quotas need kernel quota support,
#      which some kernels, e.g. Firecracker guests, lack).
#   3. dockerd (no bridge, no iptables: containers only ever run with --network none),
#      started in the background unless one already answers `docker info`.
#   4. the base image (debootstrap'd Debian + python3 + git), built once into the image
#      cache (LEGORL_CACHE, default ~/.cache/legorl/images) and imported into Docker, so
#      tests and runs only reuse it. Skip with LEGORL_SKIP_BASE=1.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
STATE="${LEGORL_STATE:-/var/lib/legorl}"
FS_IMG="$STATE/docker-btrfs.img"
FS_SIZE="${LEGORL_DOCKER_DISK:-48G}"
DATA_ROOT="$STATE/docker"
DOCKERD_LOG="${LEGORL_DOCKERD_LOG:-/var/log/legorl-dockerd.log}"

log() { echo "[setup_sandbox] $*" >&2; }

if [ "$(id -u)" != 0 ]; then
  log "must run as root (namespaces, cgroups, mounts and dockerd need it)"; exit 1
fi

# 1. packages -------------------------------------------------------------------------
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v mkfs.btrfs >/dev/null || need+=(btrfs-progs)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  apt-get update -qq
  for i in 1 2 3; do  # another apt may hold the lock for a while
    if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"; then break; fi
    [ "$i" = 3 ] && { log "apt-get install ${need[*]} failed"; exit 1; }
    sleep 10
  done
fi

# 2. btrfs with quotas for Docker's data-root ----------------------------------------
mkdir -p "$STATE" "$DATA_ROOT"
if ! mountpoint -q "$DATA_ROOT"; then
  if [ ! -f "$FS_IMG" ]; then
    log "creating $FS_SIZE sparse btrfs image $FS_IMG"
    truncate -s "$FS_SIZE" "$FS_IMG"
    mkfs.btrfs -q "$FS_IMG"
  fi
  mount -o loop "$FS_IMG" "$DATA_ROOT"
fi
btrfs quota enable "$DATA_ROOT"

# 3. dockerd --------------------------------------------------------------------------
if ! timeout 10 docker info >/dev/null 2>&1; then
  log "starting dockerd (data-root $DATA_ROOT, log $DOCKERD_LOG)"
  nohup setsid dockerd --data-root "$DATA_ROOT" --bridge=none --iptables=false --ip-masq=false \
    --storage-driver=btrfs >>"$DOCKERD_LOG" 2>&1 </dev/null &
  for _ in $(seq 1 60); do
    timeout 5 docker info >/dev/null 2>&1 && break
    sleep 1
  done
  if ! timeout 10 docker info >/dev/null 2>&1; then
    log "dockerd did not come up; last lines of $DOCKERD_LOG:"; tail -20 "$DOCKERD_LOG" >&2; exit 1
  fi
fi
if [ "$(docker info -f '{{.DockerRootDir}}')" != "$DATA_ROOT" ]; then
  log "note: a dockerd not started by this script is running (root $(docker info -f '{{.DockerRootDir}}'));"
  log "      container disk quotas need its storage driver to support --storage-opt size"
fi

# 4. base image -----------------------------------------------------------------------
if [ "${LEGORL_SKIP_BASE:-0}" != 1 ]; then
  log "ensuring the base image (first time: debootstrap, a few minutes)"
  "$PY" -m legorl.sandbox.cli build --docker
fi
log "ok"
