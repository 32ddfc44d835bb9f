#!/usr/bin/env bash
# Installs every Debian 12 package cxlpool needs to build and test.
# Idempotent: packages already present are skipped, so a second run is quick.
#   scripts/install-deps.sh          build + unit/integration test deps
#   scripts/install-deps.sh --vm     also the QEMU VM-tier prerequisites
set -euo pipefail

pkgs=(
  build-essential cmake ninja-build pkg-config git
  clang clang-format
  libclang-rt-14-dev          # clang's sanitizer and fuzzer runtimes (only a Recommends of clang)
  libhwloc-dev hwloc
  libnuma-dev numactl
  libcxl-dev libdaxctl-dev
  libboost-dev
  libprotobuf-dev protobuf-compiler
  libtomlplusplus-dev
  libcli11-dev
  nlohmann-json3-dev
  libsystemd-dev systemd
  libgtest-dev libgmock-dev
  libbenchmark-dev
  jq ccache
  universal-ctags             # scripts/unit-sizes.sh (where each function ends)
  file                        # dpkg-shlibdeps and the package test run it on every binary
  prometheus
  debhelper dh-python lintian # scripts/build-debs.sh (dpkg-buildpackage) and the package test
  groff-base mandoc           # the man pages are checked with groff -ww and mandoc -Tlint
  python3-dev pybind11-dev    # the cxlpool Python package
  python3-numpy python3-pytest python3-torch   # its tests (Debian's PyTorch 1.13)
  libgrpc++-dev protobuf-compiler-grpc          # the cluster layer speaks etcd's v3 API over gRPC
  golang-etcd-server-dev                        # etcd's published protos (rpc.proto, kv.proto)
  etcd-server etcd-client openssl               # a real etcd cluster (with TLS) in the tests
  iproute2 util-linux                           # hosts in network namespaces (ip, nsenter)
  libucx-dev ucx-utils                          # remote leases move bytes with UCX (cluster/ucx); ucx_perftest: R1, R2
)
if [[ " $* " == *" --vm "* ]]; then
  pkgs+=(qemu-system-x86 busybox-static ndctl daxctl cpio kmod xz-utils
         debootstrap e2fsprogs)   # the systemd guest's root (debootstrap, mke2fs -d)
fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Without systemd (a chroot, a container) a package's init script would start
# its service (etcd-server starts an etcd on :2379) and leave it running:
# deny service starts while installing, as Debian's policy-rc.d allows.
if [[ ! -d /run/systemd/system && ! -e /usr/sbin/policy-rc.d ]]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod 755 /usr/sbin/policy-rc.d
  trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
