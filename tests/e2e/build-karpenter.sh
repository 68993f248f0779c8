#!/usr/bin/env bash
# Build Karpenter's kwok provider and kwok from Go modules, once, and cache them with
# Karpenter's CRDs (tests/e2e/test_autoscaling.py runs both against the e2e control plane:
# Karpenter provisions fake Nodes from NodePools, kwok keeps those Nodes Ready and their pods
# Running, so scale-from-zero and consolidation run for real without a cloud or a kubelet).
#
# The versions come from the committed helper modules tests/e2e/gomod/karpenter
# (sigs.k8s.io/karpenter v1.15.0; the provider is its kwok/ main package) and
# tests/e2e/gomod/kwok (sigs.k8s.io/kwok v0.8.0), each with its own go.sum so that neither
# moves the other's dependencies. Karpenter v1.15.0's go.mod says `go 1.26.9`: its build runs
# that toolchain (golang.org/toolchain from the Go module proxy, cached in the module cache)
# when the local Go is older.
#
# Usage: tests/e2e/build-karpenter.sh [karpenter-kwok|kwok ...]   (default: both)
#   SWAPWISE_KARPENTER_BIN  output dir (default ~/.cache/swapwise/karpenter/<karpenter>-kwok-<kwok>/bin)
#   SWAPWISE_GO_P           go build -p (default 2)
#   SWAPWISE_GO_CACHE       Go module and build caches (default ~/.cache/swapwise/go; tests/go-env.sh)
# A second run builds nothing: each binary has a stamp (hash of its helper module, ldflags and
# Go version) and must carry the expected module version in its build information.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../go-env.sh
source "$here/../go-env.sh"
export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"

modver() {  # helper module dir, module path -> the version it requires
  sed -n "s#^require $2 \(v[^ ]*\)\$#\1#p" "$here/gomod/$1/go.mod"
}
gover() {  # helper module dir -> its `go` line (the toolchain it needs at least)
  sed -n 's#^go \([0-9.]*\)$#\1#p' "$here/gomod/$1/go.mod"
}
karpenter_version=$(modver karpenter sigs.k8s.io/karpenter)
kwok_version=$(modver kwok sigs.k8s.io/kwok)
[[ $karpenter_version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ && $kwok_version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || {
  echo "cannot read the versions from $here/gomod/{karpenter,kwok}/go.mod" \
    "('$karpenter_version', '$kwok_version')" >&2; exit 1; }

bin=${SWAPWISE_KARPENTER_BIN:-$HOME/.cache/swapwise/karpenter/$karpenter_version-kwok-$kwok_version/bin}
jobs=${SWAPWISE_GO_P:-2}
ldflags="-s -w"
mkdir -p "$bin"
# Karpenter says its version in its log and its build-info metric; unset, "unspecified".
karpenter_ldflags() { echo "$ldflags -X sigs.k8s.io/karpenter/pkg/operator.Version=$karpenter_version"; }

all=(karpenter-kwok kwok)
(( $# )) && wanted=("$@") || wanted=("${all[@]}")
for name in "${wanted[@]}"; do
  [[ $name == karpenter-kwok || $name == kwok ]] || {
    echo "unknown binary '$name' (known: ${all[*]})" >&2; exit 1; }
done

# The local toolchain when it is new enough for the helper module, else exactly the version
# the module asks for (Go fetches it once through the module proxy).
toolchain_for() {
  local need have
  need=$(gover "$1")
  have=$(GOTOOLCHAIN=local go env GOVERSION)
  have=${have#go}
  if [[ $(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1) == "$need" ]]; then
    echo local
  else
    echo "go$need"
  fi
}

# name -> helper module dir, module path, Go package, ldflags
spec() {
  case $1 in
    karpenter-kwok) echo "karpenter|sigs.k8s.io/karpenter|sigs.k8s.io/karpenter/kwok|$(karpenter_ldflags)" ;;
    kwok) echo "kwok|sigs.k8s.io/kwok|sigs.k8s.io/kwok/cmd/kwok|$ldflags" ;;
  esac
}

# The binaries' --version output differs between them; the module version is in their Go
# build information either way.
has_version() {  # binary, module path, version
  go version -m "$1" 2>/dev/null \
    | grep -qE "^[[:space:]]+(mod|dep)[[:space:]]+$2[[:space:]]+$3([[:space:]]|\$)"
}

# build_stamped (stamped-build.sh) takes one `key` and `version`; the two binaries come from
# two helper modules, so each is passed through it on its own with its own.
current_module="" current_path="" current_pkg="" current_ldflags=""
up_to_date() {
  [[ -x $bin/$1 && -f $bin/.stamp-$1 && $(<"$bin/.stamp-$1") == "$key" ]] \
    && has_version "$bin/$1" "$current_path" "$version"
}
build() {
  echo "==> $1: building $current_pkg $version (-p $jobs, toolchain $GOTOOLCHAIN)"
  (cd "$here/gomod/$current_module" && go build -p "$jobs" -trimpath -ldflags "$current_ldflags" \
     -o "$bin/.$1.tmp" "$current_pkg")
}
verify() {
  has_version "$bin/$1" "$current_path" "$version" && return
  echo "$1 built but its build information does not name $current_path $version:" >&2
  go version -m "$bin/$1" >&2
  return 1
}

# shellcheck source=stamped-build.sh
source "$here/stamped-build.sh"
total=0
for name in "${wanted[@]}"; do
  IFS='|' read -r current_module current_path current_pkg current_ldflags < <(spec "$name")
  GOTOOLCHAIN=$(toolchain_for "$current_module")
  export GOTOOLCHAIN
  version=$(modver "$current_module" "$current_path")
  key=$({ cat "$here/gomod/$current_module/go.mod" "$here/gomod/$current_module/go.sum"
          echo "$current_ldflags"; go version; } | sha256sum | cut -d' ' -f1)
  build_stamped "$name"
  total=$((total + built))
done

# Files the test needs from the same module versions as the binaries, each set under a stamp
# of its helper module: Karpenter's CRDs (NodePool, NodeClaim, NodeOverlay, CapacityBuffer,
# with the kwok provider's label validation, and its KWOKNodeClass), and kwok's stages
# (node-fast, heartbeat-with-lease, pod-fast: what Karpenter's kwok install applies as
# stage-fast.yaml), given to kwok in its configuration file instead of as Stage objects.
copy_files() {  # dest dir, helper module dir, module path, files relative to the module...
  local dest=$1 module=$2 path=$3 dir key file
  shift 3
  GOTOOLCHAIN=$(toolchain_for "$module")
  export GOTOOLCHAIN
  key=$({ cat "$here/gomod/$module/go.mod" "$here/gomod/$module/go.sum"; echo "$*"; } \
    | sha256sum | cut -d' ' -f1)
  [[ -f $bin/.stamp-$dest && $(<"$bin/.stamp-$dest") == "$key" && -d $bin/$dest ]] && return
  dir=$(cd "$here/gomod/$module" && go list -m -f '{{.Dir}}' "$path")
  rm -rf "$bin/$dest.tmp"
  mkdir -p "$bin/$dest.tmp"
  for file in "$@"; do cp "$dir/$file" "$bin/$dest.tmp/"; done
  chmod -R u+w "$bin/$dest.tmp"
  rm -rf "${bin:?}/$dest"
  mv "$bin/$dest.tmp" "$bin/$dest"
  echo "$key" >"$bin/.stamp-$dest"
}
copy_files crds karpenter sigs.k8s.io/karpenter \
  kwok/charts/crds/autoscaling.x-k8s.io_capacitybuffers.yaml \
  kwok/charts/crds/karpenter.sh_nodeclaims.yaml \
  kwok/charts/crds/karpenter.sh_nodeoverlays.yaml \
  kwok/charts/crds/karpenter.sh_nodepools.yaml \
  kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml
copy_files kwok-stages kwok sigs.k8s.io/kwok \
  kustomize/stage/node/fast/node-initialize.yaml \
  kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
  kustomize/stage/pod/fast/pod-ready.yaml \
  kustomize/stage/pod/fast/pod-complete.yaml \
  kustomize/stage/pod/fast/pod-delete.yaml
echo "==> Karpenter (kwok provider) and kwok in $bin ($total built), with Karpenter's CRDs" \
  "and kwok's stages"
