#!/usr/bin/env bash
# Build kube-state-metrics from Go modules, once, and cache it. The real-node suite runs it
# as users' clusters do (kube-prometheus-stack installs it): `swapwise tune` reads each pod's
# memory request and swapwise.io/profile annotation from it (the kubelet's metrics carry
# neither).
#
# The version comes from the committed helper module tests/e2e/gomod/kube-state-metrics
# (go.mod + go.sum).
#
# Usage: tests/e2e/build-kube-state-metrics.sh
#   SWAPWISE_KSM_BIN   output dir (default ~/.cache/swapwise/kube-state-metrics/<version>/bin)
#   SWAPWISE_GO_P      go build -p (default 2)
#   SWAPWISE_GO_CACHE  Go module and build caches (default ~/.cache/swapwise/go; tests/go-env.sh)
# A second run builds nothing: the binary has a stamp (hash of the helper module, ldflags and
# Go version) and must carry the expected module version in its build information.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
gomod=$here/gomod/kube-state-metrics
# shellcheck source=../go-env.sh
source "$here/../go-env.sh"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"

module=k8s.io/kube-state-metrics/v2
modver=$(sed -n "s#^require $module \(v[^ ]*\)\$#\1#p" "$gomod/go.mod")
[[ $modver =~ ^v([0-9]+\.[0-9]+\.[0-9]+)$ ]] || {
  echo "cannot read the kube-state-metrics version from $gomod/go.mod ('$modver')" >&2; exit 1; }
version=${BASH_REMATCH[1]}

bin=${SWAPWISE_KSM_BIN:-$HOME/.cache/swapwise/kube-state-metrics/$version/bin}
jobs=${SWAPWISE_GO_P:-2}
ldflags="-s -w"
mkdir -p "$bin"
(( $# == 0 )) || [[ $* == kube-state-metrics ]] || {
  echo "unknown binary '$*' (known: kube-state-metrics)" >&2; exit 1; }

key=$({ cat "$gomod/go.mod" "$gomod/go.sum"; echo "$ldflags"; go version; } \
  | sha256sum | cut -d' ' -f1)

has_version() {
  go version -m "$1" 2>/dev/null | grep -qE "^[[:space:]]+mod[[:space:]]+$module[[:space:]]+$modver([[:space:]]|\$)"
}

up_to_date() {
  [[ -x $bin/$1 && -f $bin/.stamp-$1 && $(<"$bin/.stamp-$1") == "$key" ]] && has_version "$bin/$1"
}

build() {
  echo "==> $1: building $module $modver (-p $jobs)"
  (cd "$gomod" && go build -p "$jobs" -trimpath -ldflags "$ldflags" -o "$bin/.$1.tmp" "$module")
}

verify() {
  has_version "$bin/$1" && return
  echo "$1 built but its build information does not name $module $modver:" >&2
  go version -m "$bin/$1" >&2
  return 1
}

# shellcheck source=stamped-build.sh
source "$here/stamped-build.sh"
build_stamped kube-state-metrics
echo "==> kube-state-metrics in $bin ($built built)"
