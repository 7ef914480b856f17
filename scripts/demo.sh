#!/usr/bin/env bash
# The demo (README): fetch bundled etcd binaries, build, write a small data dir
# with etcd 3.3.25, migrate it to 3.5.16 one minor at a time, then exec etcd
# 3.5.16 serving it on http://127.0.0.1:2379 until Ctrl-C.
#
# DEMO_DIR (default .cache/demo) holds the data dir; it is recreated each run.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'demo: %s\n' "$*" >&2; }

scripts/bootstrap.sh
BIN=$(images/fetch-etcd.sh 3.3.25 3.4.23 3.5.16 | tail -n1)
cargo build --release --locked
demo=${DEMO_DIR:-$PWD/.cache/demo}
data=$demo/data
name=etcd-demo
client=http://127.0.0.1:2379
peer=http://localhost:2380
rm -rf "$demo" && mkdir -p "$data" && chmod 700 "$data"

say "writing a small data dir with etcd 3.3.25 in $data"
"$BIN/etcd-3.3.25" --name "$name" --data-dir "$data" \
  --listen-client-urls http://127.0.0.1:12379 --advertise-client-urls http://127.0.0.1:12379 \
  --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
  --initial-cluster "$name=$peer" >"$demo/etcd-3.3.25.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
ctl() { ETCDCTL_API=3 "$BIN/etcdctl-3.3.25" --endpoints http://127.0.0.1:12379 "$@"; }
for _ in $(seq 100); do ctl put /registry/demo/hello world >/dev/null 2>&1 && break; sleep 0.1; done
for i in $(seq 1 50); do ctl put "/registry/pods/default/pod-$i" "{\"name\":\"pod-$i\"}" >/dev/null; done
lease=$(ctl lease grant 3600 | awk '{print $2}')
ctl put /registry/events/default/demo-event "created by the demo" --lease="$lease" >/dev/null
kill -TERM "$pid"; wait "$pid" || true
trap - EXIT
printf '3.3.25/etcd3' >"$data/version.txt"
say "52 keys written by 3.3.25 (one under a 1 h lease); version.txt says 3.3.25/etcd3"

say "migrating to 3.5.16, then exec'ing etcd 3.5.16 on $client (Ctrl-C stops it)"
say "in another shell: ETCDCTL_API=3 $BIN/etcdctl-3.5.16 --endpoints $client get --prefix /registry --keys-only"
exec target/release/etcd-migrate \
  --target-version 3.5.16 --data-dir "$data" --name "$name" --bin-dir "$BIN" \
  --initial-cluster "$name=$peer" \
  -- --name "$name" --listen-client-urls "$client" --advertise-client-urls "$client" \
     --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" --initial-cluster "$name=$peer"
