#!/usr/bin/env bash
# Build the real swap node for tests/node once, and cache it: a QEMU guest with Debian's stock
# kernel, a debootstrap root with containerd and runc, the kubelet of the control plane's
# release, and the test images.
#
# Why each piece is built here: there is no Docker engine, no registry and no release download
# on these machines; only Debian's packages and the Go module proxy. Every stage has a stamp
# (a hash of what it is made from), so a warm run rebuilds nothing and a changed input rebuilds
# only what depends on it.
#
# Usage: tests/node/build-node.sh            build what is missing; prints the artifacts file
#        tests/node/build-node.sh --prefetch  only what needs no Go build of the control plane
#                                             (host tools, kernel, Debian root, images): the
#                                             downloads, which `make test` overlaps with builds
#   SWAPWISE_NODE_CACHE   cache root (default ~/.cache/swapwise/node)
#   SWAPWISE_NODE_KERNEL  Debian kernel ABI to use (default: what linux-image-amd64 depends on)
#   SWAPWISE_GO_CACHE     Go module and build caches (default ~/.cache/swapwise/go; tests/go-env.sh)
# Output: $SWAPWISE_NODE_CACHE/artifacts.json (paths of kernel, initramfs, root disk, versions).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${SWAPWISE_NODE_CACHE:-$HOME/.cache/swapwise/node}
suite=bookworm
guest_packages=containerd,runc,containernetworking-plugins,tini,busybox-static,iproute2,procps,kmod,mount,iptables,ca-certificates
# shellcheck source=../go-env.sh
source "$here/../go-env.sh"
export CGO_ENABLED=0 GOTOOLCHAIN=local
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9   # two builds at once wait for each other instead of racing on the cache

step() { printf '==> %s\n' "$*"; }
hash_of() { sha256sum | cut -c1-16; }
fresh() { [[ -f $1/.stamp && $(<"$1/.stamp") == "$2" ]]; }   # fresh DIR KEY

# -- host tools, from Debian's packages (a new CI machine has none of them)
need=()
for pair in qemu-system-x86_64:qemu-system-x86 qemu-img:qemu-utils debootstrap:debootstrap \
            mkfs.ext4:e2fsprogs cpio:cpio modprobe:kmod ip:iproute2 \
            mkswap:util-linux unshare:util-linux; do
  command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
if (( ${#need[@]} )); then
  step "installing host packages: ${need[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi

# -- Debian's stock kernel and its modules, extracted (nothing is installed on the host)
mirror=$(awk '/^URIs:/{print $2; exit} /^deb /{print $2; exit}' \
  /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}
kver=${SWAPWISE_NODE_KERNEL:-}
if [[ -z $kver ]]; then
  kver=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/.*Depends: linux-image-\(.*-amd64\)$/\1/p' | head -1)
  if [[ -z $kver ]]; then apt-get update -q >/dev/null
    kver=$(apt-cache depends linux-image-amd64 | sed -n 's/.*Depends: linux-image-\(.*-amd64\)$/\1/p' | head -1)
  fi
fi
[[ -n $kver ]] || { echo "cannot tell Debian's kernel ABI (apt-cache depends linux-image-amd64)" >&2; exit 1; }
kdir=$cache/kernel/$kver
if ! fresh "$kdir" "$kver"; then
  step "kernel linux-image-$kver"
  rm -rf "$kdir"; mkdir -p "$kdir"
  (cd "$kdir" && apt-get download -q -o APT::Sandbox::User=root "linux-image-$kver" >/dev/null && dpkg-deb -x linux-image-"$kver"_*.deb root \
    && rm -f linux-image-"$kver"_*.deb && depmod -b root "$kver")
  echo "$kver" > "$kdir/.stamp"
fi

# -- the guest root: debootstrap minbase with containerd and runc (cached; slow once)
rkey=$(echo "$suite $guest_packages $mirror" | hash_of)
rdir=$cache/rootfs/$rkey
if ! fresh "$rdir" "$rkey"; then
  step "debootstrap $suite (+ $guest_packages)"
  rm -rf "$rdir"; mkdir -p "$cache/rootfs"
  start=$SECONDS
  debootstrap --variant=minbase --include="$guest_packages" "$suite" "$rdir/root" "$mirror" \
    > "$cache/rootfs/debootstrap.log" 2>&1 || { tail -30 "$cache/rootfs/debootstrap.log" >&2; exit 1; }
  rm -rf "$rdir/root/var/cache/apt/archives/"*.deb "$rdir/root/var/lib/apt/lists/"*
  echo "$rkey" > "$rdir/.stamp"
  step "debootstrap done in $((SECONDS - start))s"
fi

# -- the images: one static Go binary (tests/node/workload) as pause and as the workload
ikey=$( { cat "$here/workload/"*.go "$here/workload/go.mod" "$here/ociimage.py"; go version; } | hash_of)
idir=$cache/images/$ikey
if ! fresh "$idir" "$ikey"; then
  step "images (workload $ikey)"
  rm -rf "$idir"; mkdir -p "$idir"
  (cd "$here/workload" && go build -trimpath -ldflags "-s -w" -o "$idir/workload" .)
  (cd "$repo" && python3 -m tests.node.ociimage "$idir/workload" localhost/swapwise/pause:v1 "$idir/pause.tar" pause >/dev/null \
    && python3 -m tests.node.ociimage "$idir/workload" localhost/swapwise/workload:v1 "$idir/workload.tar" >/dev/null)
  echo "$ikey" > "$idir/.stamp"
fi

if [[ ${1:-} == --prefetch ]]; then
  step "prefetched: host tools, kernel $kver, root $rkey, images $ikey"
  exit 0
fi

# -- the kubelet: same helper module, ldflags and stamp logic as the control plane
"$repo/tests/e2e/build-control-plane.sh" kubelet
k8s_version=$(sed -n 's#^require k8s.io/kubernetes \(v[^ ]*\)$#\1#p' "$repo/tests/e2e/gomod/kubernetes/go.mod")
kubelet=${SWAPWISE_K8S_BIN:-$HOME/.cache/swapwise/k8s/$k8s_version/bin}/kubelet

# -- the root disk and initramfs: everything above plus the guest's own files
dkey=$( { echo "$rkey $kver $ikey"; sha256sum "$kubelet"; cat "$here/guest/"*; } | hash_of)
ddir=$cache/disk/$dkey
if ! fresh "$ddir" "$dkey"; then
  step "root disk $dkey"
  rm -rf "$ddir"; mkdir -p "$ddir"
  stage=$ddir/stage
  cp -a "$rdir/root" "$stage"
  rm -rf "$stage/lib/modules"; mkdir -p "$stage/lib/modules" "$stage/swapwise/images"
  cp -a "$kdir/root/lib/modules/$kver" "$stage/lib/modules/"
  install -m755 "$kubelet" "$stage/swapwise/kubelet"
  install -m755 "$here/guest/node-init.sh" "$stage/swapwise/node-init.sh"
  install -m644 "$here/guest/containerd.toml" "$stage/swapwise/containerd.toml"
  install -m644 "$here/guest/runsc.toml" "$stage/swapwise/runsc.toml"
  install -D -m644 "$here/guest/cni.conflist" "$stage/etc/cni/net.d/10-swapwise.conflist"
  cp "$idir/pause.tar" "$idir/workload.tar" "$stage/swapwise/images/"
  : > "$stage/etc/machine-id"
  # 3 GiB, sparse: containerd's snapshots and pod logs of a whole run fit with room to spare.
  mkfs.ext4 -q -F -L swapwise-node -d "$stage" "$ddir/root.img" 3G
  # initramfs: busybox and the modules that reach the ext4 root on virtio-blk and the 9p share
  init=$ddir/initramfs; mkdir -p "$init/bin"
  cp "$stage/bin/busybox" "$init/bin/busybox"
  install -m755 "$here/guest/initramfs-init" "$init/init"
  : > "$init/modules.order"
  for m in virtio_pci virtio_blk ext4 9pnet_virtio 9p virtio_net; do
    modprobe -d "$kdir/root" -S "$kver" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
  done | awk '!seen[$0]++' | while read -r ko; do
    rel=${ko#"$kdir/root"}; mkdir -p "$init$(dirname "$rel")"; cp "$ko" "$init$rel"; echo "$rel" >> "$init/modules.order"
  done
  (cd "$init" && find . | cpio -o -H newc --quiet) > "$ddir/initramfs.cpio"
  rm -rf "$stage" "$init"
  echo "$dkey" > "$ddir/.stamp"
fi

python3 - "$cache/artifacts.json" <<PY
import json, sys
json.dump({
    "kernel": "$kdir/root/boot/vmlinuz-$kver", "kernel_abi": "$kver",
    "initramfs": "$ddir/initramfs.cpio", "root_disk": "$ddir/root.img",
    "kubelet_version": "$k8s_version", "images": ["localhost/swapwise/pause:v1", "localhost/swapwise/workload:v1"],
}, open(sys.argv[1], "w"), indent=1)
PY
# Older disks, roots, images and kernels of this cache are not needed any more.
find "$cache/disk" -mindepth 1 -maxdepth 1 -not -name "$dkey" -exec rm -rf {} +
find "$cache/rootfs" -mindepth 1 -maxdepth 1 -type d -not -name "$rkey" -exec rm -rf {} +
find "$cache/images" -mindepth 1 -maxdepth 1 -not -name "$ikey" -exec rm -rf {} +
find "$cache/kernel" -mindepth 1 -maxdepth 1 -not -name "$kver" -exec rm -rf {} +
step "real node ready: $cache/artifacts.json"
