#!/usr/bin/env bash
# Build gVisor's runsc and its containerd shim (containerd-shim-runsc-v1) for the real node's
# gVisor scenario, once, and cache them.
#
# Why from Go modules: Debian bookworm's `runsc` package (20221219) ships no containerd shim,
# and no release download is allowed here. The version is pinned by the committed helper
# module tests/node/gvisor/ (go.mod + go.sum): the last commit of gVisor's "go" branch whose
# shim links containerd 1.6's shim library, the protocol of the guest's Debian containerd.
# The binaries are static (CGO_ENABLED=0) and reach the guest through its 9p share (node.py),
# so the cached root disk does not change when they do.
#
# Usage: tests/node/build-gvisor.sh          build what is missing; prints the artifacts file
#   SWAPWISE_NODE_CACHE   cache root (default ~/.cache/swapwise/node)
#   SWAPWISE_GO_CACHE     Go module and build caches (default ~/.cache/swapwise/go; tests/go-env.sh)
#   SWAPWISE_GO_P         go build -p (default 2)
# Output: $SWAPWISE_NODE_CACHE/gvisor.json (the directory holding both binaries, the version).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
module=$here/gvisor
cache=${SWAPWISE_NODE_CACHE:-$HOME/.cache/swapwise/node}
jobs=${SWAPWISE_GO_P:-2}
# shellcheck source=../go-env.sh
source "$here/../go-env.sh"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"
mkdir -p "$cache"
exec 9>"$cache/.lock-gvisor"
flock 9   # two builds at once wait for each other instead of racing on the cache

version=$(sed -n 's#^require gvisor.dev/gvisor \(v[^ ]*\)$#\1#p' "$module/go.mod")
[[ -n $version ]] || { echo "cannot read gvisor.dev/gvisor's version from $module/go.mod" >&2; exit 1; }
# runsc --version reports the module version (gVisor's own builds stamp it the same way).
ldflags="-s -w -X gvisor.dev/gvisor/runsc/version.version=$version"
key=$( { cat "$module/go.mod" "$module/go.sum" "$module/tools.go"; echo "$ldflags"; go version; } \
  | sha256sum | cut -c1-16)
dir=$cache/gvisor/$key
if [[ -f $dir/.stamp && $(<"$dir/.stamp") == "$key" ]]; then
  echo "==> gVisor $version: up to date"
else
  echo "==> gVisor $version: building runsc and containerd-shim-runsc-v1 (-p $jobs)"
  start=$SECONDS
  rm -rf "$dir"; mkdir -p "$dir"
  (cd "$module" \
    && go build -p "$jobs" -trimpath -ldflags "$ldflags" -o "$dir/runsc" gvisor.dev/gvisor/runsc \
    && go build -p "$jobs" -trimpath -ldflags "$ldflags" -o "$dir/containerd-shim-runsc-v1" \
      gvisor.dev/gvisor/shim)
  "$dir/runsc" --version >/dev/null   # a binary that cannot even print its version is no build
  echo "$key" > "$dir/.stamp"
  echo "==> gVisor $version: built in $((SECONDS - start))s"
fi
python3 - "$cache/gvisor.json" "$dir" "$version" <<'PY'
import json, sys
json.dump({"dir": sys.argv[2], "version": sys.argv[3]}, open(sys.argv[1], "w"), indent=1)
PY
# Older builds of this cache are not needed any more.
find "$cache/gvisor" -mindepth 1 -maxdepth 1 -not -name "$key" -exec rm -rf {} +
echo "==> gVisor ready: $cache/gvisor.json"
