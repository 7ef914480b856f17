#!/bin/sh
# migrate-if-needed.sh, and `migrate` (a symlink to this script): the names
# of the Kubernetes image's entry points, for manifests that run
#     /usr/local/bin/migrate-if-needed.sh && exec /usr/local/bin/etcd ...
# or call /usr/local/bin/migrate with its flags.
#
# Migrates the data dir to the target and exits without starting etcd: the
# manifest starts it. Same environment and flags as etcd-migrate
# (TARGET_VERSION, TARGET_STORAGE, DATA_DIRECTORY, ETCD_NAME/ETCD_HOSTNAME,
# INITIAL_CLUSTER, LISTEN_PEER_URLS, INITIAL_ADVERTISE_PEER_URLS,
# ETCD_DATA_PREFIX, ETCD_CREDS; --target-version, --data-dir, --name,
# --bin-dir, --bundled-versions, --etcd-server-extra-args, ...). Exit codes
# are etcd-migrate's: 0 done, 2 nothing touched, 3 a step failed, 143
# stopped.
#
# Like the Kubernetes image, unless DO_NOT_MOVE_BINARIES=true, after a
# successful migration /usr/local/bin/etcd, etcdctl (and etcdutl) are pointed
# at the target release, so that a manifest exec'ing /usr/local/bin/etcd runs
# the release the data was migrated to, not the newest one bundled.
bin=/usr/local/bin
target=${TARGET_VERSION:-}
prev=
for arg in "$@"; do
  case $prev in --target-version|-target-version) target=$arg ;; esac
  case $arg in --target-version=*|-target-version=*) target=${arg#*=} ;; esac
  prev=$arg
done

"$bin/etcd-migrate" --no-exec "$@" || exit

if [ "${DO_NOT_MOVE_BINARIES:-}" = true ] || [ -z "$target" ]; then
  exit 0
fi
for tool in etcd etcdctl etcdutl; do
  [ -e "$bin/$tool-$target" ] || continue
  # shellcheck disable=SC3013  # -ef: dash, bash and busybox sh have it
  [ "$bin/$tool" -ef "$bin/$tool-$target" ] && continue
  if ! ln -sfn "$tool-$target" "$bin/$tool"; then
    echo "[migrate-if-needed.sh] error: the data is at $target, but $bin/$tool cannot be pointed at $tool-$target; exec $bin/etcd-$target instead, or set DO_NOT_MOVE_BINARIES=true if $bin/$tool is what you want" >&2
    exit 1
  fi
  echo "[migrate-if-needed.sh] $bin/$tool -> $tool-$target (DO_NOT_MOVE_BINARIES is not true)" >&2
done
