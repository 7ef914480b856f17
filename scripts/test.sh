#!/usr/bin/env bash
# The project's one test command (README, .ci/run): set-up on a fresh machine,
# real etcd binaries into the git-ignored cache, then format, lint, unit and
# end-to-end tests on those binaries, then the image and its container tests.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/bootstrap.sh
ETCD_BIN_DIR=$(images/fetch-etcd.sh | tail -n1)
export ETCD_BIN_DIR
echo "test: etcd binaries in $ETCD_BIN_DIR" >&2

cargo fmt --check
# Both builds: the release one (no failpoints) and the test one.
cargo clippy --locked --all-targets -- -D warnings
cargo clippy --locked --all-targets --features failpoints -- -D warnings
# The API docs: no broken or private intra-doc link.
RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps
# Unit tests, then the end-to-end tests on real etcd (e2e/), with the named
# failpoints compiled in (src/failpoint.rs): the crash tests die at each.
cargo test --locked --all-targets --features failpoints
# The image (make image: base, bundle, docker build, smoke test) and the
# container tests on it (image-tests/: `cargo test --test image-tests --
# --ignored`, which the run above skips as ignored; "test result: ...").
make image-test
# Multi-member clusters of the same image (cluster-tests/): 3 and 5 members
# in containers on private networks, peer and client TLS made in the test, a
# writer and a monitor throughout (issue 11); the plain run above says NOT
# RUN for them.
make cluster-test
