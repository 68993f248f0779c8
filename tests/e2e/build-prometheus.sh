#!/usr/bin/env bash
# Build promtool and prometheus from Go modules, once, and cache them (the monitoring tests:
# `promtool check rules` / `promtool test rules` on the chart's alerts, every dashboard query
# parsed, and a Prometheus scraping a running swapwise).
#
# The version comes from the committed helper module tests/e2e/gomod/prometheus (go.mod +
# go.sum). Built with -tags "remove_all_sd enable_kubernetes_sd": Kubernetes service discovery
# only (the real-node tests discover the kubelet as docs/monitoring.md does; the rest use static
# targets); leaving out the cloud discovery mechanisms roughly halves the cold build.
#
# Usage: tests/e2e/build-prometheus.sh [promtool|prometheus ...]   (default: both)
#   SWAPWISE_PROM_BIN  output dir (default ~/.cache/swapwise/prometheus/<version>/bin)
#   SWAPWISE_GO_P      go build -p (default 2)
#   SWAPWISE_GO_CACHE  Go module and build caches (default ~/.cache/swapwise/go; tests/go-env.sh)
# A second run builds nothing: each binary has a stamp (hash of the helper module, tags,
# ldflags and Go version) and must report the expected version.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
gomod=$here/gomod/prometheus
# shellcheck source=../go-env.sh
source "$here/../go-env.sh"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"

modver=$(sed -n 's#^require github.com/prometheus/prometheus \(v[^ ]*\)$#\1#p' "$gomod/go.mod")
[[ $modver =~ ^v0\.([0-9]+)([0-9][0-9])\.([0-9]+)$ ]] || {
  echo "cannot read the prometheus version from $gomod/go.mod ('$modver')" >&2; exit 1; }
# The Go module v0.316.0 is Prometheus 3.16.0.
version=${BASH_REMATCH[1]}.$((10#${BASH_REMATCH[2]})).${BASH_REMATCH[3]}

bin=${SWAPWISE_PROM_BIN:-$HOME/.cache/swapwise/prometheus/$version/bin}
jobs=${SWAPWISE_GO_P:-2}
tags="remove_all_sd enable_kubernetes_sd"
ldflags="-s -w -X github.com/prometheus/common/version.Version=$version"
ldflags+=" -X github.com/prometheus/common/version.Branch=gomod"
ldflags+=" -X github.com/prometheus/common/version.Revision=$modver"
mkdir -p "$bin"

all=(promtool prometheus)
(( $# )) && wanted=("$@") || wanted=("${all[@]}")
for name in "${wanted[@]}"; do
  [[ $name == promtool || $name == prometheus ]] || {
    echo "unknown binary '$name' (known: ${all[*]})" >&2; exit 1; }
done

key=$({ cat "$gomod/go.mod" "$gomod/go.sum"; echo "$tags $ldflags"; go version; } \
  | sha256sum | cut -d' ' -f1)

up_to_date() {
  local out
  [[ -x $bin/$1 && -f $bin/.stamp-$1 && $(<"$bin/.stamp-$1") == "$key" ]] || return 1
  out=$("$bin/$1" --version 2>&1) || return 1
  [[ $out == *"version $version"* ]]
}

build() {
  echo "==> $1: building github.com/prometheus/prometheus/cmd/$1 $modver (-p $jobs, -tags $tags)"
  (cd "$gomod" && go build -p "$jobs" -trimpath -tags "$tags" -ldflags "$ldflags" \
     -o "$bin/.$1.tmp" "github.com/prometheus/prometheus/cmd/$1")
}

verify() {
  local out
  out=$("$bin/$1" --version 2>&1) || true
  [[ $out == *"version $version"* ]] && return
  echo "$1 built but '$1 --version' printed:" >&2; echo "$out" >&2
  return 1
}

# shellcheck source=stamped-build.sh
source "$here/stamped-build.sh"
build_stamped "${wanted[@]}"
echo "==> prometheus binaries in $bin ($built built)"
