#!/usr/bin/env bash
# Build the local base image the etcd image is built FROM (Dockerfile's
# BASEIMAGE). Nothing can be pulled on these machines, so the base is made
# from Debian packages and `docker import`ed.
#
# Usage: images/base.sh [--kind glibc|debian] [--tag TAG] [--force]
#
#   --kind glibc   (default) glibc's shared libraries, libgcc_s and dash from
#                  Debian bookworm's packages on an empty root: what the
#                  glibc-linked etcd binaries, etcd-migrate and the
#                  migrate-if-needed.sh / migrate shell wrappers need, plus
#                  coreutils' ln and cat (~5 MB). Like
#                  distroless/base-debian12, plus /bin/sh.
#   --kind debian  `debootstrap --variant=minbase bookworm`, docs and caches
#                  removed (~73 MB): a full Debian userland (apt, coreutils,
#                  bash) for debugging inside the container.
#   --tag TAG      image tag (default: etcd-migrate-base:glibc-bookworm or
#                  etcd-migrate-base:debian-bookworm)
#   --force        rebuild even if the tag exists with the same recipe
#
# The image is cached: when TAG exists and its label
# io.etcd-migrate.base.recipe equals this script's recipe hash, nothing is
# done. The tag is the last line of stdout; progress goes to stderr,
# prefixed "base:".
#
# Environment:
#   BASE_DEBIAN_MIRROR    Debian mirror (default: the system's apt sources'
#                         Debian mirror, else http://deb.debian.org/debian)
#   BASE_SECURITY_MIRROR  Debian security mirror (default: the system's, else
#                         http://deb.debian.org/debian-security)
#
# The system's apt configuration is never changed: packages are fetched
# with a private sources.list, lists and cache under .cache/base/apt.

set -euo pipefail

SUITE=bookworm
# glibc kind: the Debian packages whose files make the root.
GLIBC_PACKAGES=(libc6 libgcc-s1 dash coreutils base-files)
DEBIAN_KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

exec 3>&1 1>&2
log() { printf 'base: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
usage() { sed -n '2,/^$/{s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2; }

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_dir=$(dirname "$script_dir")
# shellcheck source=images/lib/private-apt.sh
source "$script_dir/lib/private-apt.sh"
cache_dir="$repo_dir/.cache/base"
kind=glibc
tag=""
force=0
while (($#)); do
  case $1 in
    --kind) (($# >= 2)) || die "--kind needs a value"; kind=$2; shift 2 ;;
    --kind=*) kind=${1#--kind=}; shift ;;
    --tag) (($# >= 2)) || die "--tag needs a value"; tag=$2; shift 2 ;;
    --tag=*) tag=${1#--tag=}; shift ;;
    --force) force=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done
case $kind in
  glibc|debian) ;;
  *) die "--kind must be glibc or debian, not '$kind'" ;;
esac
tag=${tag:-etcd-migrate-base:$kind-$SUITE}

command -v docker >/dev/null || die "docker not found"
docker info >/dev/null 2>&1 || die "the Docker daemon is not reachable (docker info failed)"

# The recipe hash: this script (and the kind). A changed script rebuilds.
recipe=$(cat "${BASH_SOURCE[0]}" "$script_dir/lib/private-apt.sh" <(printf '%s\n' "$kind" "$SUITE") | sha256sum | cut -c1-16)
if ((!force)); then
  have=$(docker image inspect -f '{{ index .Config.Labels "io.etcd-migrate.base.recipe" }}' "$tag" 2>/dev/null || true)
  if [[ $have == "$recipe" ]]; then
    log "$tag is up to date (recipe $recipe)"
    printf '%s\n' "$tag" >&3
    exit 0
  fi
  [[ -z $have ]] || log "$tag exists with recipe $have, not $recipe: rebuilding"
fi

mkdir -p "$cache_dir"
cache_dir=$(cd "$cache_dir" && pwd)
exec 9>"$cache_dir/.lock"
flock 9
work=$(mktemp -d "$cache_dir/tmp.XXXXXX")
cleanup() { rm -rf -- "$work"; }
trap cleanup EXIT
root="$work/root"
mkdir "$root"

system_mirror() {  # system_mirror REGEX: first matching URI of the system's apt sources
  local files=() f uri=""
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -r $f ]] && files+=("$f")
  done
  if ((${#files[@]})); then
    uri=$(grep -hvE '^[[:space:]]*#' "${files[@]}" \
      | grep -oE '(mirror\+)?https?://[^][:space:]]+' \
      | sed 's,/*$,,' | grep -E "$1" | head -n1) || true
  fi
  printf '%s\n' "$uri"
}
mirror=${BASE_DEBIAN_MIRROR:-$(system_mirror '/debian$')}
mirror=${mirror:-http://deb.debian.org/debian}
security_mirror=${BASE_SECURITY_MIRROR:-$(system_mirror '/debian-security$')}
security_mirror=${security_mirror:-http://deb.debian.org/debian-security}

# ---------------------------------------------------------------------------
# glibc: libraries from Debian packages on an empty root
# ---------------------------------------------------------------------------
build_glibc_root() {
  local apt="$cache_dir/apt" signed pkg deb
  private_apt_conf "$apt"
  # The suite is signed by keys debian-archive-keyring has; refuse anything
  # unsigned (no trusted=yes fallback: these files become every container's libc).
  [[ -r $DEBIAN_KEYRING ]] || die "$DEBIAN_KEYRING is missing: apt-get install debian-archive-keyring"
  signed="signed-by=$DEBIAN_KEYRING"
  {
    printf 'deb [%s] %s %s main\n' "$signed" "$mirror" "$SUITE"
    printf 'deb [%s] %s %s-updates main\n' "$signed" "$mirror" "$SUITE"
    printf 'deb [%s] %s %s-security main\n' "$signed" "$security_mirror" "$SUITE"
  } >"$apt/sources.list"
  log "apt-get update: $SUITE, $SUITE-updates, $SUITE-security from $mirror and $security_mirror"
  local out
  if ! out=$(apt-get -c "$apt/apt.conf" -q update 2>&1) \
      || grep -qE '^(E: |W: .*(GPG|NO_PUBKEY|EXPKEYSIG|not signed|signature))' <<<"$out"; then
    printf '%s\n' "$out" >&2
    die "apt-get update of Debian $SUITE failed"
  fi
  mkdir "$work/debs"
  if [[ $(id -u) == 0 ]] && id _apt >/dev/null 2>&1; then
    chown _apt "$work/debs"
    chmod 755 "$work"
  fi
  # The newest version over the three suites (apt's candidate).
  (cd "$work/debs" && apt-get -c "$apt/apt.conf" -q download "${GLIBC_PACKAGES[@]}") >&2 \
    || die "apt-get download ${GLIBC_PACKAGES[*]} failed"
  mkdir -p "$work/x" "$root/var/lib/dpkg/status.d"
  for pkg in "${GLIBC_PACKAGES[@]}"; do
    deb=$(find "$work/debs" -name "${pkg}_*.deb" | head -n1)
    [[ -n $deb ]] || die "no .deb downloaded for $pkg"
    log "unpacking $(basename "$deb")"
    dpkg-deb -x "$deb" "$work/x"
    # What scanners (trivy, grype, syft) read on distroless images.
    { dpkg-deb -f "$deb"; echo "Status: install ok installed"; } \
      >"$root/var/lib/dpkg/status.d/$pkg"
  done

  # Only the run-time pieces: glibc's shared objects and the loader (not
  # gconv, locales, nscd or the tools in /usr/bin), libgcc_s (Rust's
  # unwinder), dash as /bin/sh, and os-release.
  local x="$work/x" multi=lib/x86_64-linux-gnu
  [[ -e $x/$multi/libc.so.6 ]] || die "libc6 has no /$multi/libc.so.6 (has the layout changed?)"
  mkdir -p "$root/$multi" "$root/lib64" "$root/bin" "$root/etc" "$root/usr/lib"
  cp -a "$x/$multi/." "$root/$multi/"
  rm -rf "$root/$multi/gconv"
  cp -a "$x/lib64/." "$root/lib64/"
  cp -a "$x/bin/dash" "$root/bin/dash"
  ln -s dash "$root/bin/sh"
  # From coreutils, two tools that need only libc: ln (migrate-if-needed.sh
  # points etcd/etcdctl at the target unless DO_NOT_MOVE_BINARIES=true, as
  # the Kubernetes image did) and cat (docker exec diagnostics).
  local tool
  for tool in ln cat; do
    [[ -x $x/bin/$tool ]] || die "coreutils has no /bin/$tool"
    cp -a "$x/bin/$tool" "$root/bin/$tool"
  done
  cp -a "$x/usr/lib/os-release" "$root/usr/lib/os-release"
  ln -s ../usr/lib/os-release "$root/etc/os-release"
  cp -a "$x/etc/debian_version" "$root/etc/debian_version"
  # Debian's glibc searches /lib/x86_64-linux-gnu without a cache; an empty
  # ld.so.cache would only add a failed open.
  [[ -e $root/lib64/ld-linux-x86-64.so.2 ]] || die "libc6 has no /lib64/ld-linux-x86-64.so.2"

  # The few files a container expects. Users: root, and nobody for --user.
  printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' \
    'nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin' >"$root/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' >"$root/etc/group"
  printf '%s\n' 'passwd: files' 'group: files' 'hosts: files dns' >"$root/etc/nsswitch.conf"
  # Docker bind-mounts hosts, hostname and resolv.conf over these.
  : >"$root/etc/hosts"; : >"$root/etc/hostname"; : >"$root/etc/resolv.conf"
  mkdir -p "$root/tmp" "$root/root" "$root/usr/local/bin" "$root/var/etcd"
  chmod 1777 "$root/tmp"
  chmod 700 "$root/root"
}

# ---------------------------------------------------------------------------
# debian: debootstrap --variant=minbase
# ---------------------------------------------------------------------------
build_debian_root() {
  if ! command -v debootstrap >/dev/null; then
    [[ $(id -u) == 0 ]] || die "debootstrap is not installed (apt-get install debootstrap, as root)"
    log "installing debootstrap from Debian's packages"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >&2 \
      || die "apt-get install debootstrap failed"
  fi
  [[ $(id -u) == 0 ]] || die "debootstrap needs root"
  log "debootstrap --variant=minbase $SUITE from $mirror"
  debootstrap --variant=minbase --keyring="$DEBIAN_KEYRING" "$SUITE" "$root" "$mirror" >&2 \
    || die "debootstrap failed"
  # Trim what a runtime image does not need.
  rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/var/log/* \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
    "$root"/usr/share/locale/* "$root"/tmp/* "$root"/var/cache/debconf/*-old \
    "$root"/debootstrap
  mkdir -p "$root/var/etcd"
}

"build_${kind}_root"
size=$(du -sh --apparent-size "$root" | cut -f1)
log "root for $tag: $size; importing"
# `docker import` keeps modes and symlinks. The glibc root's files are all
# root's, whoever builds it; debootstrap's keep their owners (it runs as root).
owner=()
[[ $kind != glibc ]] || owner=(--owner=0 --group=0)
tar --numeric-owner "${owner[@]+"${owner[@]}"}" -C "$root" -c . \
  | docker import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change "LABEL io.etcd-migrate.base.recipe=$recipe" \
      --change "LABEL io.etcd-migrate.base.kind=$kind" \
      --change 'CMD ["/bin/sh"]' \
      - "$tag" >/dev/null \
  || die "docker import failed"
log "built $tag ($(docker image inspect -f '{{.Size}}' "$tag") bytes)"
printf '%s\n' "$tag" >&3
