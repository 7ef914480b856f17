#!/usr/bin/env bash
# Installs what building and testing etcd-migrate needs on a fresh Debian
# machine, and nothing else: protoc (etcd-client compiles etcd's .proto files
# at build time), rustfmt and clippy, and the container tests' openssl, curl
# and PyYAML. Docker Engine itself must be there already (the image tests use
# it). Idempotent: does nothing when all is there.
set -euo pipefail

say() { printf 'bootstrap: %s\n' "$*" >&2; }

as_root() {
  if [[ $(id -u) == 0 ]]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else say "need root to run: $*"; exit 1
  fi
}

missing=()
command -v protoc >/dev/null || missing+=(protobuf-compiler)
command -v dpkg-deb >/dev/null || missing+=(dpkg)
command -v make >/dev/null || missing+=(make)
command -v python3 >/dev/null || missing+=(python3 python3-pip)
# The container tests (image-tests/): TLS material, HTTP probes, YAML.
command -v openssl >/dev/null || missing+=(openssl)
command -v curl >/dev/null || missing+=(curl)
python3 -c 'import yaml' 2>/dev/null || missing+=(python3-yaml)
if ((${#missing[@]})); then
  say "installing ${missing[*]} from Debian's packages"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null; then
  say "cargo not found: install Rust (rustup) first"
  exit 1
fi
if command -v rustup >/dev/null; then
  for component in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$component" \
      || rustup component add "$component" >/dev/null
  done
fi
if ! docker info >/dev/null 2>&1; then
  say "Docker Engine is not reachable (docker info failed): the image tests need it"
  exit 1
fi
