# shellcheck shell=bash
# Sourced by images/fetch-etcd.sh and images/base.sh: a private apt setup in
# a directory of our own, so that fetching Debian packages never touches the
# system's apt state.

# private_apt_conf DIR: creates DIR's lists, cache, state and log dirs, an
# empty dpkg status, and DIR/apt.conf pointing every apt path into DIR (the
# caller writes DIR/sources.list). Use it with `apt-get -c DIR/apt.conf`: the
# system's apt.conf.d still applies (network settings, Check-Valid-Until of a
# snapshot mirror), but the system's update and dpkg hooks (which clean
# /var/cache/apt or refresh AppStream) are cleared, and DEP-11 metadata is
# not fetched.
private_apt_conf() {
  local d=$1
  mkdir -p "$d/lists/partial" "$d/cache/archives/partial" "$d/state" "$d/log"
  : >"$d/status"
  cat >"$d/apt.conf" <<CONF
#clear APT::Update::Post-Invoke;
#clear APT::Update::Post-Invoke-Success;
#clear DPkg::Post-Invoke;
#clear DPkg::Pre-Invoke;
Dir::Etc::SourceList "$d/sources.list";
Dir::Etc::SourceParts "/dev/null";
Dir::Etc::Preferences "/dev/null";
Dir::Etc::PreferencesParts "/dev/null";
Dir::State "$d/state";
Dir::State::Lists "$d/lists";
Dir::State::status "$d/status";
Dir::Cache "$d/cache";
Dir::Log "$d/log";
Acquire::Languages "none";
Acquire::IndexTargets::deb::DEP-11::DefaultEnabled "false";
CONF
}
