# Sourced by the build scripts: Go's module and build caches live under ~/.cache/swapwise with
# everything else swapwise caches, so one directory is all CI has to keep.
#   SWAPWISE_GO_CACHE   root of both (default ~/.cache/swapwise/go)
swapwise_go_cache=${SWAPWISE_GO_CACHE:-$HOME/.cache/swapwise/go}
export PATH="/usr/local/go/bin:$PATH"
export GOMODCACHE=$swapwise_go_cache/mod GOCACHE=$swapwise_go_cache/build
