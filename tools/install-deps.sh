#!/usr/bin/env bash
# Install every Debian package chanter needs to build, test and benchmark.
# Idempotent: packages already installed are skipped, and apt is not touched
# at all when nothing is missing. Run as root (or with sudo available).
set -euo pipefail

PKGS=(
  build-essential pkg-config make
  clang                  # make fuzz: libFuzzer targets (tests/fuzz/)
  libgrpc-dev=1.51.*     # gRPC core C API (grpc/grpc.h): pinned to Debian 12's 1.51
                         # (core 29.x); the core API changes between releases
  libprotobuf-c-dev protobuf-c-compiler
  libuv1-dev             # event loop, timers, signals, worker pool
  librocksdb-dev         # embedding server's durable store
  libsystemd-dev         # sd_notify
  libopenblas-dev        # CPU matrix products
  libgloo-dev            # CPU collectives (C++; wrapped in extern "C")
  libcmocka-dev          # unit tests
  libmicrohttpd-dev      # Prometheus text endpoint
  libgnutls28-dev        # the metrics endpoint's client certificates (status page actions)
  libssl-dev openssl     # SHA-256 digests; test certificates for TLS tests
  libxxhash-dev          # hash64 of raw categorical values (XXH3)
  python3 python3-grpcio python3-protobuf
  protobuf-compiler protobuf-compiler-grpc   # Python stubs for the cross-language test
  procps psmisc          # pkill/fuser used by tests
  iproute2               # ip, tc: chanter local up --hosts (network namespaces, veth, bridge, tbf)
  systemd                # systemd-analyze: test_systemd_units.sh verifies the units
  # Test and operator tools (the build needs none of them):
  prometheus             # test_prometheus.sh scrapes a local cluster with it (deploy/prometheus/)
  chromium               # a headless browser, for tools and tests that render pages
  gnuplot-nox            # plots from the command line (no X)
  libjs-chart.js         # Chart.js, served locally: charts in pages without a network
)

missing=()
for spec in "${PKGS[@]}"; do
  p=${spec%%=*}
  want=${spec#*=}; [ "$want" = "$spec" ] && want=""
  st=$(dpkg-query -W -f='${Status} ${Version}' "$p" 2>/dev/null || true)
  if [[ "$st" != "install ok installed"* ]] || { [ -n "$want" ] && [[ "${st##* }" != ${want} ]]; }; then
    p=$spec
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
