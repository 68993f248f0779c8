#!/usr/bin/env bash
# Build the swapwise image from the project's Dockerfile without a Docker daemon, into an
# OCI archive: build/swapwise-image.tar (image localhost/swapwise:<version>).
#
# Builder: buildah, from Debian's packages. It reads the Dockerfile as is (multi-stage,
# `RUN --mount=type=bind,from=...`), needs no daemon and, with chroot isolation and the vfs
# storage driver, runs as root inside a container or CI machine that has no overlay mounts
# or user namespaces to offer. kaniko is meant to run inside a container it may overwrite,
# and BuildKit needs its daemon (buildkitd); neither is packaged by Debian.
#
# Usage: hack/build-image.sh [--local-base]
#   --local-base  build FROM an equivalent of the upstream python:3.11-slim-bookworm base,
#                 made here from Debian's packages (for machines that cannot pull from
#                 Docker Hub, like this project's CI); without it, the Dockerfile's pinned
#                 upstream base is pulled.
#   SWAPWISE_IMAGE_CACHE  buildah storage and the local base (default ~/.cache/swapwise/image)
#   OUT                   the archive (default build/swapwise-image.tar)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${SWAPWISE_IMAGE_CACHE:-$HOME/.cache/swapwise/image}
out=${OUT:-$repo/build/swapwise-image.tar}
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/pyproject.toml" | head -1)
image=localhost/swapwise:$version
local_base=false
[[ ${1:-} == --local-base ]] && local_base=true

step() { printf '==> %s\n' "$*"; }
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

# -- the builder itself, and debootstrap for the local base (a new CI machine has neither)
need=()
command -v buildah >/dev/null || need+=(buildah)
$local_base && { command -v debootstrap >/dev/null || need+=(debootstrap); }
if (( ${#need[@]} )); then
  step "installing host packages: ${need[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi

# Storage of its own under the cache: layers survive between runs, nothing system-wide.
bah=(buildah --root "$cache/storage" --runroot "$cache/run" --storage-driver vfs)

build_args=(--build-arg "VERSION=$version")
# What goes into the wheel (.dockerignore): its digest is part of the install layer's cache
# key, which buildah otherwise takes from the instruction alone (see the Dockerfile).
source_digest=$(cd "$repo" && { find pyproject.toml README.md LICENSE constraints/newest.txt \
  webhook -type f ! -path '*/__pycache__/*' ! -name '*.py[cod]' -print0 2>/dev/null || true; } \
  | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
build_args+=(--build-arg "SOURCE_DIGEST=$source_digest")
if $local_base; then
  # Debian bookworm's python3 is 3.11, as upstream's python:3.11-slim-bookworm. What upstream
  # has and Debian's root does not: pip on PATH, `python`, and pip allowed to install into
  # the system interpreter (no EXTERNALLY-MANAGED marker).
  packages=python3,python3-pip,python3-venv,python-is-python3,ca-certificates
  mirror=$(awk '/^URIs:/{print $2; exit} /^deb /{print $2; exit}' \
    /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  key=$(echo "bookworm $packages $mirror v1" | sha256sum | cut -c1-12)
  base=localhost/swapwise-base:python3.11-bookworm-$key
fi

# An archive built from the same inputs is not built again (make test builds the image in the
# background early; the real-node stage's `make node` then finds it): the Dockerfile, the
# build context's digest, the version, the base and this script make the stamp.
stamp=$out.stamp
inputs=$( { cat "$repo/Dockerfile" "$repo/.dockerignore" "${BASH_SOURCE[0]}"
            echo "$version $source_digest ${base:-upstream}"; } | sha256sum | cut -d' ' -f1)
if [[ -f $out && -f $stamp && $(<"$stamp") == "$inputs" ]]; then
  step "image $image: $out up to date ($(du -m "$out" | cut -f1) MiB)"
  exit 0
fi

if $local_base; then
  if ! "${bah[@]}" inspect --type image "$base" >/dev/null 2>&1; then
    step "local base $base (debootstrap bookworm + $packages)"
    root=$cache/base-root
    rm -rf "$root"
    debootstrap --variant=minbase --include="$packages" bookworm "$root" "$mirror" \
      > "$cache/debootstrap.log" 2>&1 || { tail -30 "$cache/debootstrap.log" >&2; exit 1; }
    rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"* \
      "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
    ctr=$("${bah[@]}" from scratch)
    "${bah[@]}" copy "$ctr" "$root/" / >/dev/null
    "${bah[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      --env LANG=C.UTF-8 --cmd python3 "$ctr"
    "${bah[@]}" commit --quiet --rm "$ctr" "$base" >/dev/null
    rm -rf "$root"
  fi
  build_args+=(--build-arg "PYTHON_IMAGE=$base")
fi

# Build time only: pip in every stage trusts what this machine trusts (a TLS-intercepting
# egress proxy's CA, for one). Bind mounts, so nothing of it lands in a layer.
trust=()
if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
  trust+=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/host-ca.crt:ro)
  printf "[global]\\ncert = /etc/ssl/host-ca.crt\\n" > "$cache/pip.conf"
  trust+=(-v "$cache/pip.conf:/etc/pip.conf:ro")
fi

step "building $image from Dockerfile"
"${bah[@]}" build --quiet --isolation chroot --network host --layers "${trust[@]}" \
  "${build_args[@]}" -t "$image" -f "$repo/Dockerfile" "$repo" >/dev/null
mkdir -p "$(dirname "$out")"
rm -f "$out" "$stamp"
"${bah[@]}" push --quiet "$image" "oci-archive:$out:$image"
# Earlier builds' layers (vfs keeps each one whole) go; the base stays, it is tagged.
"${bah[@]}" rmi --prune >/dev/null 2>&1 || true
echo "$inputs" > "$stamp"
step "image $image: $out ($(du -m "$out" | cut -f1) MiB, gzip layers)"
