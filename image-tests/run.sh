#!/usr/bin/env bash
# Container end-to-end tests of the multi-version image (issue 4): the real
# image, real etcd, real `docker run` / `docker stop`, as root on the Docker
# host.
#
# Usage: image-tests/run.sh [TEST...]        (default: all; names below)
#
#   IMAGE      the image under test (default: etcd-migrate:dev; build it
#              with `make image`)
#   BASEIMAGE  base for the test image built from a tarball/dir bundle
#              (default: etcd-migrate-base:glibc-bookworm; that sub-test is
#              skipped when it is missing)
#
# Needs root (the tests chown volumes and read files etcd wrote), docker and
# python3; openssl, curl and PyYAML (for the kubeadm YAML) are installed from
# Debian's packages when missing. Takes about 1.5 minutes.
#
# Every container, network, image and directory a run makes carries the
# run's label or lives under its work dir, and is removed at exit (also on
# Ctrl-C).
# Prints one line per test and finally "N passed, M failed"; exits 1 if any
# failed.

set -uo pipefail

IMAGE=${IMAGE:-etcd-migrate:dev}
BASEIMAGE=${BASEIMAGE:-etcd-migrate-base:glibc-bookworm}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")

say() { printf 'image-tests: %s\n' "$*" >&2; }
[[ $(id -u) == 0 ]] || { say "run as root: the tests chown volumes and read containers' files"; exit 2; }
docker image inspect "$IMAGE" >/dev/null 2>&1 || { say "no image $IMAGE: build it with 'make image'"; exit 2; }
command -v python3 >/dev/null || { say "python3 is needed"; exit 2; }
for tool in openssl curl; do
  command -v "$tool" >/dev/null && continue
  say "$tool is missing: installing it from Debian's packages"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$tool" >/dev/null 2>&1 \
    || { say "$tool is needed (apt-get install $tool failed)"; exit 2; }
done

WORK=$(mktemp -d /tmp/etcd-migrate-image-tests.XXXXXX)
chmod 755 "$WORK"
RUN_ID=$(basename "$WORK")
RUN_ID=${RUN_ID##*.}
LABEL="io.etcd-migrate.image-test=$RUN_ID"
bg_pids=()
named_containers=()   # containers made by the examples, which carry no label
cleanup() {
  local ids
  for ids in "${named_containers[@]+"${named_containers[@]}"}"; do docker rm -f "$ids" >/dev/null 2>&1; done
  remove_labelled
  mapfile -t ids < <(docker image ls -q --filter "label=$LABEL")
  ((${#ids[@]} == 0)) || docker rmi -f "${ids[@]}" >/dev/null 2>&1
  local p
  for p in "${bg_pids[@]+"${bg_pids[@]}"}"; do kill "$p" 2>/dev/null; done
  rm -rf -- "$WORK"
}
# The containers (and their anonymous volumes) and networks of this run.
remove_labelled() {
  local ids
  mapfile -t ids < <(docker ps -aq --filter "label=$LABEL")
  ((${#ids[@]} == 0)) || docker rm -f -v "${ids[@]}" >/dev/null 2>&1
  mapfile -t ids < <(docker network ls -q --filter "label=$LABEL")
  ((${#ids[@]} == 0)) || docker network rm "${ids[@]}" >/dev/null 2>&1
}
trap cleanup EXIT

BUNDLED=$(docker image inspect -f '{{ index .Config.Labels "io.etcd-migrate.bundled-versions" }}' "$IMAGE")
IFS=, read -r -a BUNDLED_LIST <<<"$BUNDLED"
bundled() { [[ ,$BUNDLED, == *",$1,"* ]]; }
for v in 3.3.25 3.4.23 3.5.16; do
  bundled "$v" || { say "$IMAGE must bundle 3.3.25, 3.4.23 and 3.5.16 (it has $BUNDLED)"; exit 2; }
done
NEWEST=${BUNDLED_LIST[-1]}

# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------
WHY=""
# Every helper that checks something returns 1 with WHY set on failure.
why() { WHY=$*; return 1; }

dk_run() { docker run --label "$LABEL" "$@"; }

expect_eq() {  # expect_eq ACTUAL WANT WHAT
  [[ $1 == "$2" ]] || why "$3: got '$1', want '$2'"
}

logs() { docker logs "$1" 2>&1; }

# (Whole outputs go to grep, never `cmd | grep -q`: with pipefail, grep -q
# quitting early can make a long `docker logs` die of SIGPIPE, and a match
# then counts as a failure.)
has_log() {  # has_log CONTAINER FIXED-STRING
  grep -Fq -- "$2" <<<"$(logs "$1")"
}

running() { [[ $(docker inspect -f '{{.State.Running}}' "$1" 2>/dev/null) == true ]]; }

wait_log() {  # wait_log CONTAINER FIXED-STRING SECONDS
  local deadline=$((SECONDS + $3))
  while ((SECONDS < deadline)); do
    has_log "$1" "$2" && return 0
    running "$1" || { has_log "$1" "$2" && return 0; why "container exited before logging '$2'"; return 1; }
    sleep 0.05
  done
  why "no '$2' in the logs within $3 s"
}

wait_exit() {  # wait_exit CONTAINER SECONDS: prints the exit code
  local code
  code=$(timeout "$2" docker wait "$1") || { why "still running after $2 s"; return 1; }
  printf '%s\n' "$code"
}

# pid1 CONTAINER: the command line of the container's PID 1, from the host
# (docker top), so it needs nothing inside the image.
pid1() {
  local hp
  hp=$(docker inspect -f '{{.State.Pid}}' "$1")
  docker top "$1" -eo pid,args | awk -v p="$hp" '$1 == p { $1 = ""; sub(/^ /, ""); print }'
}

expect_pid1_etcd() {  # expect_pid1_etcd CONTAINER VERSION
  local cmd
  cmd=$(pid1 "$1")
  [[ $cmd == "/usr/local/bin/etcd-$2 "* || $cmd == "/usr/local/bin/etcd-$2" ]] \
    || why "PID 1 is '$cmd', not /usr/local/bin/etcd-$2"
}

# ctl CONTAINER VERSION ENDPOINT ARGS...: etcdctl of VERSION inside the container.
ctl() {
  local c=$1 v=$2 ep=$3
  shift 3
  docker exec -e ETCDCTL_API=3 "$c" "/usr/local/bin/etcdctl-$v" --endpoints "$ep" --command-timeout=5s "$@"
}

wait_serving() {  # wait_serving CONTAINER VERSION ENDPOINT SECONDS [ETCDCTL-TLS-ARGS...]
  local c=$1 v=$2 ep=$3 deadline=$((SECONDS + $4)) out
  shift 4
  while ((SECONDS < deadline)); do
    out=$(ctl "$c" "$v" "$ep" "$@" get /registry/seed/version --print-value-only 2>&1) && [[ -n $out ]] && return 0
    running "$c" || { why "container exited ($(docker inspect -f '{{.State.ExitCode}}' "$c")) instead of serving"; return 1; }
    sleep 0.1
  done
  why "etcd in $c did not serve /registry/seed/version on $ep within $4 s: $out"
}

version_txt() { cat "$1/version.txt" 2>/dev/null || echo "(none)"; }

# A fingerprint of a data dir: every file's path, size, mtime and content hash.
fingerprint() {
  (cd "$1" && find . -type f -printf '%p %s %T@\n' | sort && find . -type f -exec cat {} + | sha256sum)
}

# seed VERSION HOSTDIR NAME [SUBDIR]: a data dir written by etcd VERSION in
# HOSTDIR/SUBDIR (default data; HOSTDIR is mounted at /seed), in a container of the image,
# with the docker options in the array seed_docker and the peer flags in
# seed_peer (default: http://localhost:2380). Writes /registry/seed/version
# = VERSION and five pods, then stops etcd (SIGTERM) and writes version.txt.
seed_docker=()
seed_peer=()
seed() {  # seed VERSION HOSTDIR NAME [SUBDIR (default data)]
  local v=$1 dir=$2 name=$3 sub=${4:-data} c i peer=("${seed_peer[@]+"${seed_peer[@]}"}")
  ((${#peer[@]})) || peer=(--listen-peer-urls http://localhost:2380 --initial-advertise-peer-urls http://localhost:2380
    --initial-cluster "$name=http://localhost:2380")
  mkdir -p "$dir"
  c=$(dk_run -d "${seed_docker[@]+"${seed_docker[@]}"}" -v "$dir:/seed" \
      --entrypoint "/usr/local/bin/etcd-$v" "$IMAGE" \
      --name "$name" --data-dir "/seed/$sub" \
      --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
      "${peer[@]}") || { why "cannot start the seed etcd $v"; return 1; }
  # A deadline, not a count of tries: each try is a `docker exec`, whose
  # time grows with the machine's load.
  local deadline=$((SECONDS + 60)) took=0
  while ((SECONDS < deadline)); do
    ctl "$c" "$v" http://127.0.0.1:2379 put /registry/seed/version "$v" >/dev/null 2>&1 && { took=1; break; }
    running "$c" || break
    sleep 0.05
  done
  if ((!took)) || ! running "$c"; then
    logs "$c" | tail -n 20 >&2
    why "seed etcd $v never took a write"
    return 1
  fi
  for i in 1 2 3 4 5; do
    ctl "$c" "$v" http://127.0.0.1:2379 put "/registry/pods/default/pod-$i" "{\"name\":\"pod-$i\"}" >/dev/null \
      || { why "seed put failed"; return 1; }
  done
  docker stop -t 10 "$c" >/dev/null
  docker rm "$c" >/dev/null
  printf '%s/etcd3' "$v" >"$dir/$sub/version.txt"
  chown --reference="$dir/$sub" "$dir/$sub/version.txt"
}

# expect_keys CONTAINER VERSION ENDPOINT [TLS...]: the seeded keys are there.
expect_keys() {
  local c=$1 v=$2 ep=$3 n
  shift 3
  n=$(ctl "$c" "$v" "$ep" "$@" get --prefix /registry/pods/ --keys-only 2>&1 | grep -c '^/registry/pods/') || true
  expect_eq "$n" 5 "seeded pods readable through etcd $v on $ep"
}

# free_port VAR: sets VAR to a loopback port for a published container port.
# Not one drawn from the kernel's ephemeral range (bind to port 0): the
# kernel hands those to outgoing connections too, so a port reused after its
# container is removed (test_example_docker_run does) may have been taken
# meanwhile. Ports come from a block of 100 outside that range, locked with
# flock for the life of this run in the lock dir the e2e harness uses
# (e2e/harness/ports.rs), so concurrent runs of either never share one;
# a port something else listens on is skipped. Call it in the shell that
# runs the tests, not in $(…): the lock lives as long as that shell.
PORT_LOCK_DIR=/tmp/etcd-migrate-test-ports
port_next=0 port_end=0
free_port() {
  local low high s fd p starts=() k n
  while :; do
    if ((port_next >= port_end)); then
      read -r low high </proc/sys/net/ipv4/ip_local_port_range || { low=32768 high=60999; }
      for ((s = 10000; s + 99 <= 65535; s += 100)); do
        ((s + 99 < low || s > high)) && starts+=("$s")
      done
      if [[ ! -d $PORT_LOCK_DIR ]]; then
        mkdir -p "$PORT_LOCK_DIR" && chmod 1777 "$PORT_LOCK_DIR"
      fi
      n=${#starts[@]}
      port_end=0
      for ((k = 0; k < n; k++)); do
        s=${starts[($$ + k) % n]}
        exec {fd}>>"$PORT_LOCK_DIR/$s-$((s + 99)).lock" || continue
        if flock -n "$fd"; then
          port_next=$s port_end=$((s + 100))
          break
        fi
        exec {fd}>&-
      done
      ((port_end)) || { say "no free block of test ports in $PORT_LOCK_DIR"; return 1; }
      starts=()
    fi
    p=$port_next
    port_next=$((p + 1))
    # etcd-migrate's own default client ports are never handed out.
    [[ $p == 18629 || $p == 18631 ]] && continue
    if python3 -c 'import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))' "$p" 2>/dev/null; then
      printf -v "$1" '%s' "$p"
      return 0
    fi
  done
}

# make_certs DIR SAN...: a CA and server, peer and client certificates
# (EC P-256, 1 day), named as kubeadm names them, plus GCE's etcd-ca.crt /
# etcd-peer.{crt,key}.
make_certs() {
  local dir=$1 sans kind ext
  shift
  sans=$(printf '%s,' "$@")
  sans=${sans%,}
  mkdir -p "$dir"
  (
    cd "$dir" || exit 1
    openssl ecparam -name prime256v1 -genkey -noout -out ca.key 2>/dev/null
    openssl req -x509 -new -key ca.key -subj /CN=etcd-ca -days 1 -out ca.crt 2>/dev/null
    for kind in server peer healthcheck-client; do
      openssl ecparam -name prime256v1 -genkey -noout -out "$kind.key" 2>/dev/null
      openssl req -new -key "$kind.key" -subj "/CN=$kind" -out "$kind.csr" 2>/dev/null
      ext="subjectAltName=$sans
extendedKeyUsage=serverAuth,clientAuth"
      openssl x509 -req -in "$kind.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 \
        -extfile <(printf '%s\n' "$ext") -out "$kind.crt" 2>/dev/null || exit 1
    done
    cp ca.crt etcd-ca.crt
    cp peer.crt etcd-peer.crt
    cp peer.key etcd-peer.key
    rm -f ./*.csr ./*.srl
  ) || why "openssl could not make certificates"
}

PY=python3
yaml_python() {  # a python3 that has PyYAML, installing Debian's if needed
  local py
  for py in python3 /usr/bin/python3; do
    if command -v "$py" >/dev/null && "$py" -c 'import yaml' 2>/dev/null; then PY=$py; return 0; fi
  done
  say "PyYAML is missing: installing python3-yaml from Debian's packages"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-yaml >/dev/null 2>&1 \
    && /usr/bin/python3 -c 'import yaml' 2>/dev/null && { PY=/usr/bin/python3; return 0; }
  why "no python3 with PyYAML, and apt-get install python3-yaml failed"
}

# pod_args MANIFEST CONTAINER ROOT: the manifest's docker run arguments into
# the array pod_argv.
pod_args() {
  local out
  out=$("$PY" "$here/pod2docker.py" "$1" --container "$2" --image "$IMAGE" --root "$3" | base64 -w0) \
    || { why "pod2docker.py $1 failed"; return 1; }
  mapfile -d '' -t pod_argv < <(base64 -d <<<"$out")
}

# ---------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------

# The image's layout: versioned binaries, the newest-release names, the
# wrappers and the entrypoint.
test_layout() {
  local c list v entry
  entry=$(docker image inspect -f '{{json .Config.Entrypoint}}' "$IMAGE")
  expect_eq "$entry" '["/usr/local/bin/etcd-migrate"]' "entrypoint" || return 1
  c=$(docker create --label "$LABEL" "$IMAGE")
  list=$(docker export "$c" | tar -tv | awk '{ $1 = $2 = $3 = $4 = $5 = ""; sub(/^ +/, ""); print }')
  docker rm "$c" >/dev/null
  for v in "${BUNDLED_LIST[@]}"; do
    grep -qx "usr/local/bin/etcd-$v" <<<"$list" || { why "no /usr/local/bin/etcd-$v"; return 1; }
    grep -qx "usr/local/bin/etcdctl-$v" <<<"$list" || { why "no /usr/local/bin/etcdctl-$v"; return 1; }
    if [[ $v != [0-2].* && $v != 3.[0-4].* ]]; then
      grep -qx "usr/local/bin/etcdutl-$v" <<<"$list" || { why "no /usr/local/bin/etcdutl-$v"; return 1; }
    fi
  done
  grep -qx "usr/local/bin/etcd -> etcd-$NEWEST" <<<"$list" || { why "etcd does not name etcd-$NEWEST"; return 1; }
  grep -qx "usr/local/bin/etcdctl -> etcdctl-$NEWEST" <<<"$list" || { why "etcdctl does not name etcdctl-$NEWEST"; return 1; }
  grep -qx "usr/local/bin/migrate -> migrate-if-needed.sh" <<<"$list" || { why "no migrate -> migrate-if-needed.sh"; return 1; }
  grep -qx "usr/local/bin/migrate-if-needed.sh" <<<"$list" || { why "no migrate-if-needed.sh"; return 1; }
  grep -qx "usr/local/bin/etcd-migrate" <<<"$list" || { why "no etcd-migrate"; return 1; }
  docker run --rm --label "$LABEL" "$IMAGE" --version | grep >/dev/null '^etcd-migrate ' \
    || { why "docker run IMAGE --version does not print etcd-migrate's version"; return 1; }
}

# images/bundle.sh with an upstream-style tarball served on 127.0.0.1 and a
# local directory; a sha256 mismatch, a tarball missing a tool and a
# mislabelled binary are refused; the staged context builds an image whose
# ETCD_VERSIONS must match it, and that image migrates.
test_bundle_sources() {
  bundled 3.5.1 || { why "needs 3.5.1 in $IMAGE to make a tarball from"; return 1; }
  local w="$WORK/bundle" c port sha bad out tag v
  mkdir -p "$w/srv" "$w/tar/etcd-v3.5.1-linux-amd64" "$w/tar2/etcd-v3.5.1-linux-amd64" "$w/dir"
  c=$(docker create --label "$LABEL" "$IMAGE")
  for f in etcd etcdctl etcdutl; do
    docker cp "$c:/usr/local/bin/$f-3.5.1" "$w/tar/etcd-v3.5.1-linux-amd64/$f" || { why "docker cp $f-3.5.1"; return 1; }
  done
  if ! { docker cp "$c:/usr/local/bin/etcd-3.4.23" "$w/dir/etcd" && docker cp "$c:/usr/local/bin/etcdctl-3.4.23" "$w/dir/etcdctl" \
      && docker cp "$c:/usr/local/bin/etcd-migrate" "$w/etcd-migrate"; }; then
    why "docker cp from $IMAGE"; return 1
  fi
  docker rm "$c" >/dev/null
  tar -C "$w/tar" -czf "$w/srv/etcd-v3.5.1-linux-amd64.tar.gz" etcd-v3.5.1-linux-amd64
  cp "$w/tar/etcd-v3.5.1-linux-amd64/etcd" "$w/tar/etcd-v3.5.1-linux-amd64/etcdctl" "$w/tar2/etcd-v3.5.1-linux-amd64/"
  tar -C "$w/tar2" -czf "$w/srv/no-etcdutl.tar.gz" etcd-v3.5.1-linux-amd64
  sha=$(sha256sum <"$w/srv/etcd-v3.5.1-linux-amd64.tar.gz" | cut -d' ' -f1)
  bad=$(printf '%s' "$sha" | tr 0-9a-f 1-9a-f0)

  python3 -u -m http.server 0 --bind 127.0.0.1 --directory "$w/srv" >"$w/http.log" 2>&1 &
  bg_pids+=($!)
  for _ in $(seq 100); do
    port=$(grep -oE 'port [0-9]+' "$w/http.log" | head -n1 | cut -d' ' -f2) && [[ -n $port ]] && break
    sleep 0.05
  done
  [[ -n ${port:-} ]] || { why "python3 -m http.server did not start"; return 1; }
  local url="http://127.0.0.1:$port/etcd-v3.5.1-linux-amd64.tar.gz"
  local ctx="$w/ctx/.cache/image-context"
  local bundle=("$repo/images/bundle.sh" --cache "$w/cache" --migrate "$w/etcd-migrate")

  # A wrong sha256 is refused, and nothing is staged.
  if out=$("${bundle[@]}" --out "$ctx" --tarball "3.5.1=$url#$bad" 2>&1); then
    why "a sha256 mismatch was accepted"; return 1
  fi
  grep -q "sha256 mismatch" <<<"$out" || { why "mismatch message missing: $out"; return 1; }
  [[ ! -e $ctx && ! -e $w/cache/tarballs/$bad.tar.gz ]] || { why "a refused tarball left files"; return 1; }
  # A 3.5 tarball without etcdutl is refused.
  local sha2
  sha2=$(sha256sum <"$w/srv/no-etcdutl.tar.gz" | cut -d' ' -f1)
  if out=$("${bundle[@]}" --out "$ctx" --tarball "3.5.1=http://127.0.0.1:$port/no-etcdutl.tar.gz#$sha2" 2>&1); then
    why "a 3.5 tarball without etcdutl was accepted"; return 1
  fi
  grep -q "has no etcd-v3.5.1-linux-amd64/etcdutl" <<<"$out" || { why "missing-etcdutl message missing: $out"; return 1; }
  # A binary that reports another version than its label is refused.
  if out=$("${bundle[@]}" --out "$ctx" --dir "3.4.22=$w/dir" 2>&1); then
    why "a mislabelled binary was accepted"; return 1
  fi
  grep -q "does not report version 3.4.22" <<<"$out" || { why "mislabel message missing: $out"; return 1; }
  # The right sha256, and a local dir: staged.
  out=$("${bundle[@]}" --out "$ctx" --tarball "3.5.1=$url#$sha" --dir "3.4.23=$w/dir" 2>&1 | tail -n1) \
    || { why "bundle.sh failed"; return 1; }
  expect_eq "$out" "$ctx" "bundle.sh's last line" || return 1
  expect_eq "$(cat "$ctx/VERSIONS")" "3.4.23,3.5.1" "VERSIONS" || return 1
  for f in etcd-3.4.23 etcdctl-3.4.23 etcd-3.5.1 etcdctl-3.5.1 etcdutl-3.5.1 etcd-migrate migrate-if-needed.sh; do
    [[ -x $ctx/bin/$f ]] || { why "$f not staged"; return 1; }
  done
  expect_eq "$(readlink "$ctx/bin/etcd")" etcd-3.5.1 "etcd symlink" || return 1
  grep -q "etcdutl-3.5.1  tarball $url sha256=$sha" "$ctx/bundle-3.4.23,3.5.1.txt" \
    || { why "manifest does not record the tarball"; return 1; }
  cmp -s "$ctx/bin/etcd-3.5.1" "$w/tar/etcd-v3.5.1-linux-amd64/etcd" || { why "staged etcd-3.5.1 differs from the tarball's"; return 1; }

  if ! docker image inspect "$BASEIMAGE" >/dev/null 2>&1; then
    say "  (no $BASEIMAGE: building an image from this bundle is skipped)"
    return 0
  fi
  tag="etcd-migrate-image-test:$RUN_ID"
  # ETCD_VERSIONS must match the staged bundle.
  if out=$(docker build -q --label "$LABEL" --build-arg BASEIMAGE="$BASEIMAGE" \
      --build-arg ETCD_VERSIONS=3.4.23,3.5.16 -f "$repo/Dockerfile" "$w/ctx" 2>&1); then
    why "docker build with ETCD_VERSIONS not matching the bundle succeeded"; return 1
  fi
  grep -q "bundle-3.4.23,3.5.16.txt" <<<"$out" || { why "mismatched build failed for another reason: $out"; return 1; }
  docker build -q --label "$LABEL" --build-arg BASEIMAGE="$BASEIMAGE" --build-arg ETCD_VERSIONS=3.4.23,3.5.1 \
    -t "$tag" -f "$repo/Dockerfile" "$w/ctx" >/dev/null 2>"$w/build.err" \
    || { why "docker build of the tarball bundle failed: $(tail -n3 "$w/build.err")"; return 1; }
  "$repo/images/smoke.sh" "$tag" 2>/dev/null || { why "smoke test of $tag failed"; return 1; }
  # It migrates 3.4.23 data to the tarball's 3.5.1 and becomes etcd 3.5.1.
  seed_docker=(); seed_peer=()
  seed 3.4.23 "$w/vol" etcd0 || return 1
  c=$(dk_run -d -v "$w/vol:/var/etcd" -e TARGET_VERSION=3.5.1 -e DATA_DIRECTORY=/var/etcd/data \
      -e ETCD_NAME=etcd0 "$tag")
  wait_serving "$c" 3.5.1 http://127.0.0.1:2379 30 || return 1
  expect_pid1_etcd "$c" 3.5.1 || return 1
  expect_eq "$(version_txt "$w/vol/data")" 3.5.1/etcd3 "version.txt" || return 1
  docker rm -f "$c" >/dev/null
  docker rmi "$tag" >/dev/null
}

# 3.3.25 data on a bind-mounted host dir -> TARGET_VERSION=3.5.16: migrated
# one minor at a time, then PID 1 is etcd 3.5.16 serving the data, on a
# published port too. Restarts with a patch target and with a rollback
# target.
test_migrate_and_serve() {
  local w="$WORK/migrate" c port out code before
  seed_docker=(); seed_peer=()
  seed 3.3.25 "$w" etcd0 || return 1
  free_port port || { why "no free test port"; return 1; }
  c=$(dk_run -d -v "$w:/var/etcd" -p "127.0.0.1:$port:2379" \
      -e TARGET_VERSION=3.5.16 -e DATA_DIRECTORY=/var/etcd/data -e ETCD_NAME=etcd0 "$IMAGE" \
      -- --listen-client-urls=http://0.0.0.0:2379 --advertise-client-urls=http://127.0.0.1:2379)
  wait_serving "$c" 3.5.16 http://127.0.0.1:2379 60 || return 1
  expect_pid1_etcd "$c" 3.5.16 || return 1
  # The walk: 3.3.25 -> 3.4.23 -> 3.5.16, each a step, then exec.
  has_log "$c" "step done step=1/2 recorded=3.4.23/etcd3" || { why "no recorded 3.4.23 step"; return 1; }
  has_log "$c" "step done step=2/2 recorded=3.5.16/etcd3" || { why "no recorded 3.5.16 step"; return 1; }
  has_log "$c" "exec program=/usr/local/bin/etcd-3.5.16" || { why "no exec line"; return 1; }
  expect_eq "$(ctl "$c" 3.5.16 http://127.0.0.1:2379 get /registry/seed/version --print-value-only)" 3.3.25 \
    "key written by 3.3.25" || return 1
  expect_keys "$c" 3.5.16 http://127.0.0.1:2379 || return 1
  out=$(curl -fsS "http://127.0.0.1:$port/version") || { why "published port $port does not answer"; return 1; }
  [[ $out == *'"etcdserver":"3.5.16"'* ]] || { why "GET /version on the published port: $out"; return 1; }
  expect_eq "$(version_txt "$w/data")" 3.5.16/etcd3 "version.txt" || return 1
  expect_eq "$(stat -c %a "$w/data")" 700 "data dir mode" || return 1
  docker stop -t 10 "$c" >/dev/null
  code=$(docker inspect -f '{{.State.ExitCode}}' "$c")
  [[ $code == 0 || $code == 143 ]] || { why "etcd exited $code on docker stop"; return 1; }
  docker rm "$c" >/dev/null

  # A new TARGET_VERSION, a patch: recorded without a step.
  if bundled 3.5.30; then
    c=$(dk_run -d -v "$w:/var/etcd" -e TARGET_VERSION=3.5.30 -e DATA_DIRECTORY=/var/etcd/data \
        -e ETCD_NAME=etcd0 "$IMAGE")
    wait_serving "$c" 3.5.30 http://127.0.0.1:2379 30 || return 1
    expect_pid1_etcd "$c" 3.5.30 || return 1
    expect_keys "$c" 3.5.30 http://127.0.0.1:2379 || return 1
    expect_eq "$(version_txt "$w/data")" 3.5.30/etcd3 "version.txt after the patch upgrade" || return 1
    docker stop -t 10 "$c" >/dev/null
    docker rm "$c" >/dev/null
  fi

  # A rollback target (3.5 -> 3.4): executed once the rollback issue lands;
  # until then refused with exit 2, nothing touched, etcd never started.
  before=$(fingerprint "$w/data")
  c=$(dk_run -d -v "$w:/var/etcd" -e TARGET_VERSION=3.4.23 -e DATA_DIRECTORY=/var/etcd/data \
      -e ETCD_NAME=etcd0 "$IMAGE")
  local deadline=$((SECONDS + 60))
  while ((SECONDS < deadline)) && running "$c" && ! has_log "$c" "exec program="; do sleep 0.1; done
  if running "$c"; then
    wait_serving "$c" 3.4.23 http://127.0.0.1:2379 30 || return 1
    expect_pid1_etcd "$c" 3.4.23 || return 1
    expect_keys "$c" 3.4.23 http://127.0.0.1:2379 || return 1
    expect_eq "$(version_txt "$w/data")" 3.4.23/etcd3 "version.txt after the rollback" || return 1
    say "  rollback 3.5 -> 3.4 executed"
  else
    code=$(docker inspect -f '{{.State.ExitCode}}' "$c")
    expect_eq "$code" 2 "exit code of a refused rollback" || return 1
    has_log "$c" "etcd started" && { why "a refused rollback started etcd"; return 1; }
    expect_eq "$(fingerprint "$w/data")" "$before" "data dir after a refused rollback" || return 1
    say "  rollback 3.5 -> 3.4 refused with exit 2, data untouched: $(logs "$c" | grep -m1 ' error ' | cut -c1-160)"
  fi
}

# docker stop while a step's etcd runs: that etcd is stopped with SIGTERM,
# the container exits 143 well within the grace period, version.txt still
# names the last completed release, and the next start resumes and converges.
test_stop_during_step() {
  local w="$WORK/stop" c t0 code elapsed
  seed_docker=(); seed_peer=()
  seed 3.3.25 "$w" etcd0 || return 1
  # A longer election timeout (ETCD_CREDS reach every step etcd, last) keeps
  # the first step's etcd busy for ~3 s: room to stop it mid-step.
  c=$(dk_run -d -v "$w:/var/etcd" -e TARGET_VERSION=3.5.16 -e DATA_DIRECTORY=/var/etcd/data \
      -e ETCD_NAME=etcd0 -e ETCD_CREDS=--election-timeout=3000 "$IMAGE")
  wait_log "$c" "etcd started step=1/2 version=3.4.23" 30 || return 1
  t0=$(date +%s%N)
  docker stop -t 10 "$c" >/dev/null
  elapsed=$((($(date +%s%N) - t0) / 1000000))
  code=$(wait_exit "$c" 5) || return 1
  expect_eq "$code" 143 "exit code after docker stop" || return 1
  # Under the 10 s grace with room to spare (exit 143, not 137, already
  # shows docker did not have to SIGKILL); a loaded machine adds seconds
  # to docker's own round trips.
  ((elapsed < 9000)) || { why "docker stop took ${elapsed} ms (the grace period is 10 s)"; return 1; }
  has_log "$c" "healthy and stopped step=1/" && { why "the step completed before the stop; the test did not hit it"; return 1; }
  # The step's etcd went on SIGTERM, without escalation to SIGKILL. (etcd
  # 3.x installs its own SIGTERM handler only once it serves, so a step etcd
  # stopped before its first write exits by SIGTERM's default action, which
  # its WAL and bolt db are made to survive; the resumed run below proves it.)
  has_log "$c" "SIGKILL" && { why "the step's etcd had to be SIGKILLed"; return 1; }
  has_log "$c" "exec program=" && { why "etcd was exec'd after a stop"; return 1; }
  expect_eq "$(version_txt "$w/data")" 3.3.25/etcd3 "version.txt after the stop" || return 1
  say "  stopped in step 1 after $elapsed ms, exit 143: $(logs "$c" | grep -m1 -E 'error|signal' | cut -c1-150)"
  # The same container, started again, resumes from 3.3.25 and converges.
  docker start "$c" >/dev/null
  wait_serving "$c" 3.5.16 http://127.0.0.1:2379 60 || return 1
  expect_pid1_etcd "$c" 3.5.16 || return 1
  expect_keys "$c" 3.5.16 http://127.0.0.1:2379 || return 1
  expect_eq "$(version_txt "$w/data")" 3.5.16/etcd3 "version.txt after the resumed run" || return 1
}

# Failed migrations: the exit code and etcd-migrate's error reach docker
# logs, and etcd is never started on unmigrated data.
test_failures() {
  local w="$WORK/fail" c code before
  seed_docker=(); seed_peer=()
  seed 3.3.25 "$w" etcd0 || return 1
  before=$(fingerprint "$w/data")

  # A target that is not bundled: exit 2, nothing touched.
  c=$(dk_run -d -v "$w:/var/etcd" -e TARGET_VERSION=3.6.99 -e DATA_DIRECTORY=/var/etcd/data \
      -e ETCD_NAME=etcd0 "$IMAGE")
  code=$(wait_exit "$c" 30) || return 1
  expect_eq "$code" 2 "exit code, target not bundled" || return 1
  has_log "$c" "3.6.99" || { why "the error does not name 3.6.99: $(logs "$c")"; return 1; }
  has_log "$c" "exit=2" || { why "no exit=2 in the logs: $(logs "$c")"; return 1; }
  has_log "$c" "etcd started" && { why "etcd was started"; return 1; }
  expect_eq "$(fingerprint "$w/data")" "$before" "data dir after exit 2" || return 1
  say "  not bundled: $(logs "$c" | grep -m1 ' error ' | cut -c1-150)"

  # No TARGET_VERSION: exit 2 naming it.
  c=$(dk_run -d -v "$w:/var/etcd" -e DATA_DIRECTORY=/var/etcd/data "$IMAGE")
  code=$(wait_exit "$c" 30) || return 1
  expect_eq "$code" 2 "exit code, no TARGET_VERSION" || return 1
  has_log "$c" "TARGET_VERSION" || { why "the error does not name TARGET_VERSION: $(logs "$c")"; return 1; }

  # A peer URL on an address this host does not have: refused before any
  # etcd starts (exit 2), naming the address and where it comes from.
  c=$(dk_run -d -v "$w:/var/etcd" -e TARGET_VERSION=3.5.16 -e DATA_DIRECTORY=/var/etcd/data \
      -e ETCD_NAME=etcd0 -e LISTEN_PEER_URLS=http://203.0.113.1:2380 "$IMAGE")
  code=$(wait_exit "$c" 60) || return 1
  expect_eq "$code" 2 "exit code, unbindable peer URL" || return 1
  has_log "$c" "203.0.113.1:2380" || { why "the error does not name the address: $(logs "$c" | tail -n5)"; return 1; }
  has_log "$c" "LISTEN_PEER_URLS" || { why "the error does not name LISTEN_PEER_URLS: $(logs "$c" | tail -n5)"; return 1; }
  has_log "$c" "etcd started" && { why "etcd was started"; return 1; }
  expect_eq "$(fingerprint "$w/data")" "$before" "data dir after exit 2" || return 1
  say "  unbindable peer URL: $(logs "$c" | grep -m1 ' error ' | cut -c1-150)"

  # An etcd that cannot start (a flag it does not know, through ETCD_CREDS):
  # exit 3, the error quotes etcd's own words, version.txt unchanged, no
  # exec.
  c=$(dk_run -d -v "$w:/var/etcd" -e TARGET_VERSION=3.5.16 -e DATA_DIRECTORY=/var/etcd/data \
      -e ETCD_NAME=etcd0 -e ETCD_CREDS=--no-such-flag "$IMAGE")
  code=$(wait_exit "$c" 60) || return 1
  expect_eq "$code" 3 "exit code, etcd cannot start" || return 1
  has_log "$c" "exit=3" || { why "no exit=3 in the logs: $(logs "$c")"; return 1; }
  logs "$c" | sed -n '/ error /,$p' | grep >/dev/null "flag provided but not defined: -no-such-flag" \
    || { why "the error does not quote etcd's complaint: $(logs "$c" | tail -n5)"; return 1; }
  has_log "$c" "exec program=" && { why "etcd was exec'd after a failed step"; return 1; }
  expect_eq "$(version_txt "$w/data")" 3.3.25/etcd3 "version.txt after a failed step" || return 1
  say "  etcd cannot start: $(logs "$c" | grep -m1 ' error ' | cut -c1-150)"
}

# --user 1000:1000: a fresh data dir on a volume that user owns is created
# 0700 and served; 3.4.23 data of that user migrates; a root-owned volume
# fails cleanly.
test_non_root() {
  local w="$WORK/user" c code uids
  mkdir -p "$w/fresh" "$w/rootowned"
  chown 1000:1000 "$w/fresh"
  c=$(dk_run -d --user 1000:1000 -v "$w/fresh:/var/etcd" -e TARGET_VERSION=3.5.16 \
      -e DATA_DIRECTORY=/var/etcd/data -e ETCD_NAME=etcd0 "$IMAGE" \
      -- --initial-cluster=etcd0=http://localhost:2380)
  local deadline=$((SECONDS + 30))
  until ctl "$c" 3.5.16 http://127.0.0.1:2379 put /registry/seed/version fresh >/dev/null 2>&1; do
    if ! running "$c" || ((SECONDS >= deadline)); then
      why "fresh etcd as 1000 did not serve: $(logs "$c" | tail -n5)"; return 1
    fi
    sleep 0.1
  done
  expect_pid1_etcd "$c" 3.5.16 || return 1
  expect_eq "$(stat -c '%a %u:%g' "$w/fresh/data")" "700 1000:1000" "fresh data dir mode and owner" || return 1
  expect_eq "$(version_txt "$w/fresh/data")" 3.5.16/etcd3 "version.txt of the fresh dir" || return 1
  [[ -z $(find "$w/fresh" ! -uid 1000) ]] || { why "files not owned by 1000: $(find "$w/fresh" ! -uid 1000)"; return 1; }
  uids=$(docker top "$c" -eo pid,uid | awk 'NR > 1 { print $2 }' | sort -u)
  expect_eq "$uids" 1000 "uid of the container's processes" || return 1

  # 3.4.23 data written by uid 1000, migrated by uid 1000.
  mkdir -p "$w/old"
  chown 1000:1000 "$w/old"
  seed_docker=(--user 1000:1000); seed_peer=()
  seed 3.4.23 "$w/old" etcd0 || return 1
  seed_docker=()
  c=$(dk_run -d --user 1000:1000 -v "$w/old:/var/etcd" -e TARGET_VERSION=3.5.16 \
      -e DATA_DIRECTORY=/var/etcd/data -e ETCD_NAME=etcd0 "$IMAGE")
  wait_serving "$c" 3.5.16 http://127.0.0.1:2379 30 || return 1
  expect_keys "$c" 3.5.16 http://127.0.0.1:2379 || return 1
  expect_eq "$(stat -c '%a %u' "$w/old/data") $(stat -c %u "$w/old/data/version.txt")" "700 1000 1000" \
    "migrated data dir mode/owner and version.txt owner" || return 1
  [[ -z $(find "$w/old" ! -uid 1000) ]] || { why "files not owned by 1000 after the migration"; return 1; }

  # A volume the user cannot write: refused before anything (exit 2), with
  # the owner and the chown that fixes it; no etcd.
  c=$(dk_run -d --user 1000:1000 -v "$w/rootowned:/var/etcd" -e TARGET_VERSION=3.5.16 \
      -e DATA_DIRECTORY=/var/etcd/data -e ETCD_NAME=etcd0 "$IMAGE")
  code=$(wait_exit "$c" 30) || return 1
  expect_eq "$code" 2 "exit code, a root-owned volume as uid 1000" || return 1
  has_log "$c" "not readable and writable by uid 1000" || { why "the error does not say who cannot write: $(logs "$c")"; return 1; }
  has_log "$c" "chown -R 1000" || { why "the error does not give the fix: $(logs "$c")"; return 1; }
  has_log "$c" "etcd started" && { why "etcd was started"; return 1; }
  say "  root-owned volume as 1000: exit $code: $(logs "$c" | grep -m1 ' error ' | cut -c1-150)"
}

# Zombie reaping while PID 1: a step binary that orphans a child (a helper
# bin dir whose etcd-3.4.23 forks a short-lived grandchild and execs the
# real one). PID 1 reaps it; nothing is left as a zombie after the exec.
test_reaps_orphans() {
  local w="$WORK/reap" c f zombies
  mkdir -p "$w/bin"
  for f in $(docker run --rm --label "$LABEL" --entrypoint /bin/sh "$IMAGE" -c \
      'cd /usr/local/bin && for f in etcd-[0-9]* etcdctl-[0-9]* etcdutl-[0-9]*; do [ -e "$f" ] && echo "$f"; done'); do
    ln -s "/usr/local/bin/$f" "$w/bin/$f"
  done
  rm "$w/bin/etcd-3.4.23"
  cat >"$w/bin/etcd-3.4.23" <<'EOF'
#!/bin/sh
# The subshell exits at once: its background child is re-parented to PID 1.
( /usr/local/bin/etcdctl-3.4.23 version >/dev/null 2>&1 & )
exec /usr/local/bin/etcd-3.4.23 "$@"
EOF
  chmod 755 "$w/bin/etcd-3.4.23"
  seed_docker=(); seed_peer=()
  seed 3.3.25 "$w/vol" etcd0 || return 1
  c=$(dk_run -d -v "$w/vol:/var/etcd" -v "$w/bin:/helper-bin:ro" -e TARGET_VERSION=3.5.16 \
      -e DATA_DIRECTORY=/var/etcd/data -e ETCD_NAME=etcd0 "$IMAGE" --bin-dir /helper-bin)
  wait_serving "$c" 3.5.16 http://127.0.0.1:2379 60 || return 1
  has_log "$c" "reaped orphan" || { why "no 'reaped orphan' in the logs"; return 1; }
  zombies=$(docker top "$c" -eo pid,stat,args | awk 'NR > 1 && $2 ~ /Z/')
  [[ -z $zombies ]] || { why "zombies left: $zombies"; return 1; }
  say "  $(logs "$c" | grep -c 'reaped orphan') orphan(s) reaped, no zombies after exec"
}

# Kubernetes image compatibility: an old-style manifest that runs
# migrate-if-needed.sh and then execs /usr/local/bin/etcd (no
# DO_NOT_MOVE_BINARIES), with a target older than the newest bundled release,
# runs the target; `migrate` with flags migrates and exits.
test_legacy_wrappers() {
  local w="$WORK/legacy" c code
  seed_docker=(); seed_peer=()
  seed 3.3.25 "$w" etcd-kube-master || return 1
  c=$(dk_run -d -v "$w:/var/etcd" -e TARGET_STORAGE=etcd3 -e TARGET_VERSION=3.4.23 \
      -e DATA_DIRECTORY=/var/etcd/data -e ETCD_HOSTNAME=kube-master --entrypoint /bin/sh "$IMAGE" -c \
      'if [ -e /usr/local/bin/migrate-if-needed.sh ]; then /usr/local/bin/migrate-if-needed.sh 1>>/var/etcd/etcd.log 2>&1; fi; exec /usr/local/bin/etcd --name etcd-kube-master --data-dir /var/etcd/data --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 1>>/var/etcd/etcd.log 2>&1')
  wait_serving "$c" 3.4.23 http://127.0.0.1:2379 60 || { cat "$w/etcd.log" >&2; return 1; }
  ctl "$c" 3.4.23 http://127.0.0.1:2379 endpoint status -w json | grep >/dev/null '"version":"3.4.23"' \
    || { why "/usr/local/bin/etcd is not serving as 3.4.23"; return 1; }
  grep -q "/usr/local/bin/etcd -> etcd-3.4.23" "$w/etcd.log" || { why "the wrapper did not point etcd at 3.4.23"; return 1; }
  expect_eq "$(version_txt "$w/data")" 3.4.23/etcd3 "version.txt" || return 1
  docker rm -f "$c" >/dev/null

  # `migrate` with the Kubernetes migrate binary's flags: migrates, exits 0.
  c=$(dk_run -d -v "$w:/var/etcd" --entrypoint /usr/local/bin/migrate "$IMAGE" \
      --name etcd-kube-master --data-dir /var/etcd/data --target-version 3.5.16 --target-storage etcd3 \
      --bundled-versions "$BUNDLED" --initial-cluster etcd-kube-master=http://localhost:2380)
  code=$(wait_exit "$c" 60) || return 1
  expect_eq "$code" 0 "migrate's exit code" || return 1
  expect_eq "$(version_txt "$w/data")" 3.5.16/etcd3 "version.txt after migrate" || return 1
  has_log "$c" "exec program=" && { why "migrate exec'd etcd"; return 1; }
  return 0
}

# examples/docker-run.sh, run as written: a new cluster at 3.4.23, then the
# same command with TARGET_VERSION=3.5.16 migrates it.
test_example_docker_run() {
  local w="$WORK/dockerrun" name="etcd-example-$RUN_ID" port out
  free_port port || { why "no free test port"; return 1; }
  named_containers+=("$name")
  # The example's container carries no test label: removed here by name.
  cleanup_example() { docker rm -f "$name" >/dev/null 2>&1; }
  IMAGE=$IMAGE NAME=$name DATA=$w PORT=$port TARGET_VERSION=3.4.23 sh "$repo/examples/docker-run.sh" >/dev/null \
    || { why "docker-run.sh failed"; cleanup_example; return 1; }
  if ! wait_put "$name" 3.4.23 30; then cleanup_example; return 1; fi
  out=$(curl -fsS "http://127.0.0.1:$port/version") || out=""
  [[ $out == *'"etcdserver":"3.4.23"'* ]] || { why "127.0.0.1:$port/version: ${out:-no answer}"; cleanup_example; return 1; }
  docker rm -f "$name" >/dev/null
  IMAGE=$IMAGE NAME=$name DATA=$w PORT=$port TARGET_VERSION=3.5.16 sh "$repo/examples/docker-run.sh" >/dev/null \
    || { why "docker-run.sh (3.5.16) failed"; cleanup_example; return 1; }
  if ! wait_serving "$name" 3.5.16 http://127.0.0.1:2379 60 || ! expect_pid1_etcd "$name" 3.5.16; then
    cleanup_example; return 1
  fi
  out=$(curl -fsS "http://127.0.0.1:$port/version")
  [[ $out == *'"etcdserver":"3.5.16"'* ]] || { why "after the upgrade: $out"; cleanup_example; return 1; }
  has_log "$name" "recorded=3.5.16/etcd3" || { why "no 3.5.16 step"; cleanup_example; return 1; }
  expect_eq "$(version_txt "$w/data")" 3.5.16/etcd3 "version.txt" || { cleanup_example; return 1; }
  cleanup_example
}

wait_put() {  # wait_put CONTAINER VERSION SECONDS: write /registry/seed/version
  local deadline=$((SECONDS + $3))
  until ctl "$1" "$2" http://127.0.0.1:2379 put /registry/seed/version "$2" >/dev/null 2>&1; do
    if ! running "$1" || ((SECONDS >= deadline)); then
      why "$1 did not take a write: $(logs "$1" | tail -n5)"; return 1
    fi
    sleep 0.1
  done
}

# examples/gce-etcd.manifest and gce-etcd-events.manifest, run as the kubelet
# would run them on one master (both pods share the node's network, as with
# hostNetwork), with peer TLS through ETCD_CREDS, on 3.3.25 data.
test_example_gce() {
  local root="$WORK/gce/node" node c1 c2
  make_certs "$root/etc/srv/kubernetes" DNS:kube-master DNS:localhost IP:127.0.0.1 || return 1
  # The node: a network namespace with the hostname kube-master (a shell
  # waiting on stdin keeps it open).
  node=$(dk_run -d -i --hostname kube-master --entrypoint /bin/sh "$IMAGE" -c 'read -r _')
  local creds=(--peer-trusted-ca-file /s/etcd-ca.crt --peer-cert-file /s/etcd-peer.crt --peer-key-file /s/etcd-peer.key -peer-client-cert-auth)
  seed_docker=(--network "container:$node" -v "$root/etc/srv/kubernetes:/s:ro")
  seed_peer=(--listen-peer-urls https://127.0.0.1:2380 --initial-advertise-peer-urls https://kube-master:2380
    --initial-cluster etcd-kube-master=https://kube-master:2380 "${creds[@]}")
  seed 3.3.25 "$root/mnt/master-pd/var/etcd" etcd-kube-master data || return 1
  seed_peer=(--listen-peer-urls https://127.0.0.1:2381 --initial-advertise-peer-urls https://kube-master:2381
    --initial-cluster etcd-kube-master=https://kube-master:2381 "${creds[@]}")
  seed 3.3.25 "$root/mnt/master-pd/var/etcd" etcd-kube-master data-events || return 1
  seed_docker=(); seed_peer=()

  pod_args "$repo/examples/gce-etcd.manifest" etcd-container "$root" || return 1
  c1=$(dk_run -d --network "container:$node" "${pod_argv[@]}") || { why "docker run of gce-etcd.manifest failed"; return 1; }
  pod_args "$repo/examples/gce-etcd-events.manifest" etcd-container "$root" || return 1
  c2=$(dk_run -d --network "container:$node" "${pod_argv[@]}") || { why "docker run of gce-etcd-events.manifest failed"; return 1; }
  wait_serving "$c1" 3.5.16 http://127.0.0.1:2379 60 || { tail -n 20 "$root/var/log/etcd.log" >&2; return 1; }
  wait_serving "$c2" 3.5.16 http://127.0.0.1:4002 60 || { tail -n 20 "$root/var/log/etcd-events.log" >&2; return 1; }
  expect_pid1_etcd "$c1" 3.5.16 || return 1
  expect_pid1_etcd "$c2" 3.5.16 || return 1
  expect_keys "$c1" 3.5.16 http://127.0.0.1:2379 || return 1
  expect_keys "$c2" 3.5.16 http://127.0.0.1:4002 || return 1
  grep -q "migrated version=3.5.16/etcd3 steps=2" "$root/var/log/etcd.log" || { why "etcd.log has no migration"; return 1; }
  grep -q "client=http://127.0.0.1:18631" "$root/var/log/etcd-events.log" || { why "events steps did not use port 18631"; return 1; }
  expect_eq "$(version_txt "$root/mnt/master-pd/var/etcd/data")" 3.5.16/etcd3 "etcd version.txt" || return 1
  expect_eq "$(version_txt "$root/mnt/master-pd/var/etcd/data-events")" 3.5.16/etcd3 "etcd-events version.txt" || return 1
  # The peers speak TLS with ETCD_CREDS' certificates, in the steps too.
  ctl "$c1" 3.5.16 http://127.0.0.1:2379 member list | grep >/dev/null 'https://kube-master:2380' \
    || { why "etcd's member does not advertise https://kube-master:2380"; return 1; }
  # A step etcd (relayed as [etcd-3.4.23]) ran with ETCD_CREDS' peer TLS.
  grep -q '^\[etcd-3.4.23\] .*peerTLS: cert = /etc/srv/kubernetes/etcd-peer.crt' "$root/var/log/etcd.log" \
    || { why "the 3.4.23 step did not get ETCD_CREDS' peer TLS"; return 1; }
}

# examples/kubeadm-etcd.yaml, run as the kubelet would run it, on a network
# where the container has the manifest's node IP, with kubeadm's TLS, on
# 3.4.23 data.
test_example_kubeadm() {
  local w="$WORK/kubeadm" root="$WORK/kubeadm/node" net c pki tls
  yaml_python || return 1
  pki="$root/etc/kubernetes/pki/etcd"
  make_certs "$pki" DNS:node1 DNS:localhost IP:127.0.0.1 IP:198.51.100.10 || return 1
  net=$(docker network create --label "$LABEL" --subnet 198.51.100.0/24 "etcd-migrate-test-$RUN_ID") \
    || { why "cannot create a docker network on 198.51.100.0/24"; return 1; }
  seed_docker=(--network "$net" --ip 198.51.100.10 --hostname node1 -v "$pki:/pki:ro")
  seed_peer=(--listen-peer-urls https://198.51.100.10:2380 --initial-advertise-peer-urls https://198.51.100.10:2380
    --initial-cluster node1=https://198.51.100.10:2380 --peer-cert-file /pki/peer.crt --peer-key-file /pki/peer.key
    --peer-trusted-ca-file /pki/ca.crt --peer-client-cert-auth)
  seed 3.4.23 "$w/seed" node1 || return 1
  seed_docker=(); seed_peer=()
  mkdir -p "$root/var/lib"
  mv "$w/seed/data" "$root/var/lib/etcd"
  pod_args "$repo/examples/kubeadm-etcd.yaml" etcd "$root" || return 1
  c=$(dk_run -d --network "$net" --ip 198.51.100.10 --hostname node1 "${pod_argv[@]}") \
    || { why "docker run of kubeadm-etcd.yaml failed"; return 1; }
  tls=(--cacert /etc/kubernetes/pki/etcd/ca.crt --cert /etc/kubernetes/pki/etcd/healthcheck-client.crt
    --key /etc/kubernetes/pki/etcd/healthcheck-client.key)
  wait_serving "$c" 3.5.16 https://127.0.0.1:2379 60 "${tls[@]}" || { logs "$c" | tail -n 20 >&2; return 1; }
  expect_pid1_etcd "$c" 3.5.16 || return 1
  expect_keys "$c" 3.5.16 https://198.51.100.10:2379 "${tls[@]}" || return 1
  expect_eq "$(version_txt "$root/var/lib/etcd")" 3.5.16/etcd3 "version.txt" || return 1
  has_log "$c" "step done step=1/1 recorded=3.5.16/etcd3" || { why "no 3.5.16 step"; return 1; }
  # From the host, over the node IP, with a client certificate.
  curl -fsS --cacert "$pki/ca.crt" --cert "$pki/healthcheck-client.crt" --key "$pki/healthcheck-client.key" \
    https://198.51.100.10:2379/version | grep >/dev/null '"etcdserver":"3.5.16"' \
    || { why "https://198.51.100.10:2379/version from the host"; return 1; }
  # Without a client certificate: refused (client-cert-auth).
  if curl -fsS --cacert "$pki/ca.crt" https://198.51.100.10:2379/version >/dev/null 2>&1; then
    why "etcd served a client without a certificate"; return 1
  fi
}

# ---------------------------------------------------------------------------
ALL_TESTS=(layout bundle_sources migrate_and_serve stop_during_step failures non_root reaps_orphans
  legacy_wrappers example_docker_run example_gce example_kubeadm)

run_all() {
  local tests=("$@") t start passed=0 failed=0 failed_names=()
  ((${#tests[@]})) || tests=("${ALL_TESTS[@]}")
  for t in "${tests[@]}"; do
    declare -F "test_$t" >/dev/null || { say "unknown test $t (tests: ${ALL_TESTS[*]})"; return 2; }
  done
  say "image $IMAGE (etcd $BUNDLED), work dir $WORK"
  for t in "${tests[@]}"; do
    WHY=""
    start=$SECONDS
    if "test_$t"; then
      passed=$((passed + 1))
      printf 'PASS %-22s %3d s\n' "$t" $((SECONDS - start))
    else
      failed=$((failed + 1))
      failed_names+=("$t")
      printf 'FAIL %-22s %3d s  %s\n' "$t" $((SECONDS - start)) "${WHY:-(no reason recorded)}"
    fi
    # Each test's containers go when it ends.
    remove_labelled
  done
  ((failed == 0)) || say "failed: ${failed_names[*]}"
  echo "$passed passed, $failed failed"
  ((failed == 0))
}

# kill_tree PID: SIGTERM to PID and every descendant, by id.
kill_tree() {
  local c kids=()
  read -r -a kids < <(cat /proc/"$1"/task/*/children 2>/dev/null | tr '\n' ' ')
  for c in "${kids[@]+"${kids[@]}"}"; do kill_tree "$c"; done
  kill -TERM "$1" 2>/dev/null
}

# The tests run in a child; this shell only waits, so a stop signal (Ctrl-C,
# SIGTERM) interrupts `wait` at once and the EXIT trap removes everything.
# (Bash does not run a trap reliably while it waits for a command
# substitution: it may die of the signal instead.)
run_all "$@" &
child=$!
trap 'kill_tree "$child"; wait "$child" 2>/dev/null; say "interrupted"; exit 130' INT TERM
wait "$child"
