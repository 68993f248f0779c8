#!/usr/bin/env bash
# Build the local Kubernetes control plane for the e2e tests from Go modules, once, and cache it.
#
# Why: the machine (and CI) has no Docker and no release downloads, only the Go module proxy.
# The versions come from the committed helper modules under tests/e2e/gomod/ (go.mod + go.sum),
# so a clean machine reproduces exactly this build.
#
# Usage: tests/e2e/build-control-plane.sh [BINARY...]   (default: all seven; `kubelet`, for the
#        real-node tests under tests/node/, only when named)
#   SWAPWISE_K8S_VERSION  Kubernetes line: 1.34 (default; helper module gomod/kubernetes) or
#                      1.37 (gomod/kubernetes-1.37); etcd, helm (3) and helm4 are the same
#                      versions for both lines
#   SWAPWISE_K8S_BIN   output dir (default ~/.cache/swapwise/k8s/<k8s version>/bin)
#   SWAPWISE_GO_P      go build -p (default 2)
#   SWAPWISE_GO_CACHE  Go module and build caches (default ~/.cache/swapwise/go; tests/go-env.sh)
# A second run builds nothing: each binary has a stamp (hash of its helper module, ldflags and
# Go version) and must report the expected version.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
gomod=$here/gomod
# shellcheck source=../go-env.sh
source "$here/../go-env.sh"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"

k8s_line=${SWAPWISE_K8S_VERSION:-1.34}
if [[ $k8s_line == 1.34 ]]; then k8s_module=kubernetes; else k8s_module=kubernetes-$k8s_line; fi
[[ -f $gomod/$k8s_module/go.mod ]] || {
  echo "SWAPWISE_K8S_VERSION=$k8s_line: no helper module $gomod/$k8s_module" >&2; exit 1; }
modver() { sed -n "s#^require $2 \(v[^ ]*\)\$#\1#p" "$gomod/$1/go.mod"; }
k8s_version=$(modver "$k8s_module" k8s.io/kubernetes)       # v1.34.4 or v1.37.2
etcd_version=$(modver etcd go.etcd.io/etcd/server/v3)       # v3.6.5
helm_version=$(modver helm helm.sh/helm/v3)                 # v3.19.5
helm4_version=$(modver helm4 helm.sh/helm/v4)               # v4.3.1
[[ -n $k8s_version && -n $etcd_version && -n $helm_version && -n $helm4_version ]] || {
  echo "cannot read versions from $gomod/*/go.mod" >&2; exit 1; }
k8s_minor=$(cut -d. -f2 <<<"$k8s_version")

bin=${SWAPWISE_K8S_BIN:-$HOME/.cache/swapwise/k8s/$k8s_version/bin}
jobs=${SWAPWISE_GO_P:-2}
mkdir -p "$bin"

all=(etcd kube-apiserver kube-scheduler kube-controller-manager kubectl helm helm4)
(( $# )) && wanted=("$@") || wanted=("${all[@]}")

k8s_ldflags() {
  local pkg out=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    out+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
    out+=" -X $pkg.gitTreeState=clean"
  done
  echo "-s -w$out"
}
helm_ldflags() {
  local out="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"
  out+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  local pkg
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    out+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
  done
  echo "$out"
}
# Helm 4 takes its default .Capabilities.KubeVersion from the k8s.io/client-go it is built
# with (v0.37 -> 1.37); there is no variable to stamp, so the same binary serves every line.
helm4_ldflags() {
  echo "-s -w -X helm.sh/helm/v4/internal/version.version=$helm4_version" \
    "-X helm.sh/helm/v4/internal/version.gitTreeState=clean"
}

# name -> helper module, Go package, ldflags, command printing its version, expected substring
spec() {
  case $1 in
    etcd) echo "etcd|go.etcd.io/etcd/server/v3|-s -w|--version|etcd Version: ${etcd_version#v}" ;;
    kube-apiserver | kube-scheduler | kube-controller-manager | kubelet)
      echo "$k8s_module|k8s.io/kubernetes/cmd/$1|$(k8s_ldflags)|--version|Kubernetes $k8s_version" ;;
    kubectl)
      echo "$k8s_module|k8s.io/kubernetes/cmd/kubectl|$(k8s_ldflags)|version --client|Client Version: $k8s_version" ;;
    helm)
      echo "helm|helm.sh/helm/v3/cmd/helm|$(helm_ldflags)|version --template={{.Version}}|$helm_version" ;;
    helm4)
      echo "helm4|helm.sh/helm/v4/cmd/helm|$(helm4_ldflags)|version --template={{.Version}}|$helm4_version" ;;
    *) echo "unknown binary '$1' (known: ${all[*]} kubelet)" >&2; return 1 ;;
  esac
}

stamp_key() {  # what the binary depends on: helper module, ldflags, Go toolchain
  local module=$1 ldflags=$2
  { cat "$gomod/$module/go.mod" "$gomod/$module/go.sum"; echo "$ldflags"; go version; } \
    | sha256sum | cut -d' ' -f1
}

up_to_date() {  # in DIR: binary exists, stamp matches and it reports the expected version
  local dir=$1 name=$2 key=$3 vcmd=$4 want=$5 out
  [[ -x $dir/$name && -f $dir/.stamp-$name && $(<"$dir/.stamp-$name") == "$key" ]] || return 1
  # shellcheck disable=SC2086  # vcmd is a word list on purpose
  out=$("$dir/$name" $vcmd 2>&1) || return 1
  [[ $out == *"$want"* ]]
}

shared_copy() {  # an identical build (same stamp) in another line's directory: copy it
  local name=$1 key=$2 vcmd=$3 want=$4 other
  for other in "$bin"/../../*/bin; do
    [[ $other -ef $bin ]] && continue
    up_to_date "$other" "$name" "$key" "$vcmd" "$want" || continue
    cp -f "$other/$name" "$bin/.$name.tmp"
    mv -f "$bin/.$name.tmp" "$bin/$name"
    echo "$key" >"$bin/.stamp-$name"
    echo "==> $name: copied from $(cd "$other" && pwd) (same stamp: $want)"
    return 0
  done
  return 1
}

for name in "${wanted[@]}"; do spec "$name" >/dev/null; done  # fail early on a typo

exec 9>"$bin/.lock"
flock 9   # concurrent callers (e.g. two pytest sessions) wait instead of racing

checked_generator=0
built=0
for name in "${wanted[@]}"; do
  IFS='|' read -r module pkg ldflags vcmd want < <(spec "$name")
  key=$(stamp_key "$module" "$ldflags")
  if up_to_date "$bin" "$name" "$key" "$vcmd" "$want"; then
    echo "==> $name: up to date ($want)"
    continue
  fi
  # etcd and helm4 do not depend on the line: built once, then copied between lines.
  if shared_copy "$name" "$key" "$vcmd" "$want"; then
    continue
  fi
  if [[ $module == "$k8s_module" && $checked_generator == 0 ]]; then
    # The replace list must match the release's own go.mod (derived, not hand-written).
    "$gomod/kubernetes/generate.sh" --check "$k8s_version"
    checked_generator=1
  fi
  echo "==> $name: building $pkg ($module helper module, -p $jobs)"
  start=$SECONDS
  (cd "$gomod/$module" && go build -p "$jobs" -trimpath -ldflags "$ldflags" -o "$bin/.$name.tmp" "$pkg")
  mv -f "$bin/.$name.tmp" "$bin/$name"
  # shellcheck disable=SC2086
  out=$("$bin/$name" $vcmd 2>&1) || true
  if [[ $out != *"$want"* ]]; then
    echo "$name built but '$name $vcmd' printed:" >&2; echo "$out" >&2; exit 1
  fi
  echo "$key" >"$bin/.stamp-$name"
  secs=$((SECONDS - start))
  printf '%s\t%s\t%ss\t%s\n' "$(date -u +%FT%TZ)" "$name" "$secs" "$(go version | cut -d' ' -f3)" \
    >>"$bin/build-times.tsv"
  echo "==> $name: built in ${secs}s ($want)"
  built=$((built + 1))
done

echo "==> control plane binaries in $bin ($built built)"
