#!/usr/bin/env bash
# Build the Vertical Pod Autoscaler's admission controller and updater from Go modules, once,
# and cache them with the module's CRDs (deploy/vpa-v1-crd-gen.yaml) (tests/e2e/test_vpa.py runs both against the e2e control plane; the
# recommender is not needed: the test writes each VPA's status.recommendation itself).
#
# The version comes from the committed helper module tests/e2e/gomod/vpa (go.mod + go.sum):
# VPA 1.5.1, the release built against Kubernetes 1.34.
#
# Usage: tests/e2e/build-vpa.sh [admission-controller|updater ...]   (default: both)
#   SWAPWISE_VPA_BIN   output dir (default ~/.cache/swapwise/vpa/<version>/bin)
#   SWAPWISE_GO_P      go build -p (default 2)
#   SWAPWISE_GO_CACHE  Go module and build caches (default ~/.cache/swapwise/go; tests/go-env.sh)
# A second run builds nothing: each binary has a stamp (hash of the helper module, ldflags and
# Go version) and must carry the expected module version in its build information.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
gomod=$here/gomod/vpa
# shellcheck source=../go-env.sh
source "$here/../go-env.sh"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"

module=k8s.io/autoscaler/vertical-pod-autoscaler
modver=$(sed -n "s#^require $module \(v[^ ]*\)\$#\1#p" "$gomod/go.mod")
[[ $modver =~ ^v([0-9]+\.[0-9]+\.[0-9]+)$ ]] || {
  echo "cannot read the VPA version from $gomod/go.mod ('$modver')" >&2; exit 1; }
version=${BASH_REMATCH[1]}

bin=${SWAPWISE_VPA_BIN:-$HOME/.cache/swapwise/vpa/$version/bin}
jobs=${SWAPWISE_GO_P:-2}
ldflags="-s -w"
mkdir -p "$bin"

all=(admission-controller updater)
(( $# )) && wanted=("$@") || wanted=("${all[@]}")
for name in "${wanted[@]}"; do
  [[ $name == admission-controller || $name == updater ]] || {
    echo "unknown binary '$name' (known: ${all[*]})" >&2; exit 1; }
done

key=$({ cat "$gomod/go.mod" "$gomod/go.sum"; echo "$ldflags"; go version; } \
  | sha256sum | cut -d' ' -f1)

# The binaries have no --version flag; the module version is in their Go build information.
has_version() {
  go version -m "$1" 2>/dev/null | grep -qE "^[[:space:]]+(mod|dep)[[:space:]]+$module[[:space:]]+$modver([[:space:]]|\$)"
}

up_to_date() {
  [[ -x $bin/$1 && -f $bin/.stamp-$1 && $(<"$bin/.stamp-$1") == "$key" ]] && has_version "$bin/$1"
}

build() {
  echo "==> $1: building $module/pkg/$1 $modver (-p $jobs)"
  (cd "$gomod" && go build -p "$jobs" -trimpath -ldflags "$ldflags" \
     -o "$bin/.$1.tmp" "$module/pkg/$1")
}

verify() {
  has_version "$bin/$1" && return
  echo "$1 built but its build information does not name $module $modver:" >&2
  go version -m "$bin/$1" >&2
  return 1
}

# shellcheck source=stamped-build.sh
source "$here/stamped-build.sh"
build_stamped "${wanted[@]}"

# The VerticalPodAutoscaler CRDs, from the same module version (its deploy/ directory).
crd=$bin/vpa-v1-crd-gen.yaml
if [[ ! -f $crd || ! -f $bin/.stamp-crd || $(<"$bin/.stamp-crd") != "$key" ]]; then
  dir=$(cd "$gomod" && go list -m -f '{{.Dir}}' "$module")
  rm -f "$crd.tmp"
  cp "$dir/deploy/vpa-v1-crd-gen.yaml" "$crd.tmp"
  chmod u+w "$crd.tmp"
  mv -f "$crd.tmp" "$crd"
  echo "$key" >"$bin/.stamp-crd"
fi
echo "==> VPA binaries and CRDs in $bin ($built built)"
