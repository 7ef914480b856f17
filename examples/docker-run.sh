#!/bin/sh
# The multi-version image with plain `docker run`: etcd-migrate walks the
# data dir on the host directory $DATA to $TARGET_VERSION, one minor at a
# time, then becomes etcd $TARGET_VERSION (PID 1), serving on
# 127.0.0.1:$PORT. An empty or missing $DATA/data starts a new one-member
# cluster at $TARGET_VERSION.
#
# To upgrade later: `docker rm -f etcd`, then run this again with a newer
# TARGET_VERSION. Stop with `docker stop etcd`: a migration step under way
# is stopped cleanly and resumed on the next start.
#
# Every setting can be overridden from the environment:
IMAGE=${IMAGE:-etcd-migrate:dev}
NAME=${NAME:-etcd}                       # container name
DATA=${DATA:-/var/lib/etcd-migrate}      # host dir, mounted at /var/etcd
PORT=${PORT:-2379}                       # host port (loopback only)
TARGET_VERSION=${TARGET_VERSION:-3.5.16}
MEMBER=${MEMBER:-etcd0}                  # etcd member name: keep it stable
set -eu
mkdir -p "$DATA"
docker run -d --name "$NAME" --restart unless-stopped \
  -v "$DATA:/var/etcd" \
  -p "127.0.0.1:$PORT:2379" \
  -e TARGET_VERSION="$TARGET_VERSION" \
  -e DATA_DIRECTORY=/var/etcd/data \
  -e ETCD_NAME="$MEMBER" \
  "$IMAGE" \
  -- --listen-client-urls=http://0.0.0.0:2379 \
     --advertise-client-urls="http://127.0.0.1:$PORT" \
     --initial-cluster="$MEMBER=http://localhost:2380"
