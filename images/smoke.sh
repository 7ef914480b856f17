#!/usr/bin/env bash
# Smoke-test a built image: every bundled binary runs in it and reports its
# version (so the base has the libraries it needs), etcd/etcdctl/etcdutl name
# the newest release, the wrappers are there, and the entrypoint answers.
#
# Usage: images/smoke.sh IMAGE
set -euo pipefail
image=${1:?usage: images/smoke.sh IMAGE}
log() { printf 'smoke: %s\n' "$*" >&2; }

versions=$(docker image inspect -f '{{ index .Config.Labels "io.etcd-migrate.bundled-versions" }}' "$image") \
  || { log "ERROR: no image $image"; exit 1; }
[[ -n $versions ]] || { log "ERROR: $image has no io.etcd-migrate.bundled-versions label"; exit 1; }
entry=$(docker image inspect -f '{{json .Config.Entrypoint}}' "$image")
[[ $entry == '["/usr/local/bin/etcd-migrate"]' ]] || { log "ERROR: entrypoint is $entry"; exit 1; }

# Inside the image, with its /bin/sh only (dash: no grep, no sed).
# shellcheck disable=SC2016  # expanded by the container's shell
script='
set -u
cd /usr/local/bin
fail=0
bad() { echo "smoke: FAIL: $*" >&2; fail=1; }
has() { case $2 in *"$1"*) return 0 ;; esac; return 1; }
newest=""
IFS=,
set -- $1
unset IFS
for v in "$@"; do
  major=${v%%.*}; rest=${v#*.}; minor=${rest%%.*}
  out=$(./etcd-$v --version 2>&1) || bad "etcd-$v --version failed: $out"
  has "etcd Version: $v" "$out" || bad "etcd-$v says: $out"
  if [ "$major" -gt 3 ] || { [ "$major" -eq 3 ] && [ "$minor" -ge 4 ]; }; then
    out=$(ETCDCTL_API=3 ./etcdctl-$v version 2>&1) || bad "etcdctl-$v version failed: $out"
  else
    out=$(./etcdctl-$v --version 2>&1) || bad "etcdctl-$v --version failed: $out"
  fi
  has "etcdctl version" "$out" && has "$v" "$out" || bad "etcdctl-$v says: $out"
  if [ "$major" -gt 3 ] || { [ "$major" -eq 3 ] && [ "$minor" -ge 5 ]; }; then
    out=$(./etcdutl-$v version 2>&1) || bad "etcdutl-$v version failed: $out"
    has "etcdutl version: $v" "$out" || bad "etcdutl-$v says: $out"
  fi
  newest=$v
done
[ etcd -ef "etcd-$newest" ] || bad "etcd does not name etcd-$newest"
[ etcdctl -ef "etcdctl-$newest" ] || bad "etcdctl does not name etcdctl-$newest"
[ -x migrate-if-needed.sh ] || bad "no migrate-if-needed.sh"
[ migrate -ef migrate-if-needed.sh ] || bad "migrate is not migrate-if-needed.sh"
out=$(./etcd-migrate --version 2>&1) || bad "etcd-migrate --version failed: $out"
has "etcd-migrate " "$out" || bad "etcd-migrate says: $out"
exit $fail
'
if ! docker run --rm --network none --entrypoint /bin/sh "$image" -c "$script" smoke "$versions"; then
  log "ERROR: $image failed its smoke test"
  exit 1
fi
log "$image: etcd $versions, etcd-migrate and the wrappers run"
