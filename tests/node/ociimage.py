"""Write a one-layer OCI image-layout tar that ``ctr images import`` loads.

Why: the real node has no registry to pull from and there is no Docker engine to build with.
A static binary in a single layer is all the pause container and the test workload need,
and the OCI image layout is a documented format of plain JSON and tar, so it is written
here byte-for-byte reproducibly (fixed mtimes, sorted keys): the same binary gives the same
digest, so the cache stamp of the node disk stays valid.

    python -m tests.node.ociimage BINARY NAME OUT.tar [ENTRYPOINT_ARG...]
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar"
INDEX = "application/vnd.oci.image.index.v1+json"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _add(tar: tarfile.TarFile, path: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(path)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def _layer(binary: bytes, path_in_image: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, path_in_image, binary, 0o755)
    return buf.getvalue()


def write_image(binary: Path, name: str, out: Path, entrypoint: list[str]) -> str:
    """Write ``out`` holding image ``name`` (``host/repo:tag``); return the manifest digest."""
    if ":" not in name.rsplit("/", 1)[-1]:
        raise ValueError(f"{name!r}: the image name needs a tag (repo:tag)")
    layer = _layer(binary.read_bytes(), entrypoint[0].lstrip("/"))
    config = _canonical({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/"]},
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
    })
    manifest = _canonical({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "digest": _digest(config), "size": len(config)},
        "layers": [{"mediaType": LAYER, "digest": _digest(layer), "size": len(layer)}],
    })
    index = _canonical({
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [{
            "mediaType": MANIFEST,
            "digest": _digest(manifest),
            "size": len(manifest),
            "platform": {"architecture": "amd64", "os": "linux"},
            # containerd names the imported image after this annotation.
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
            },
        }],
    })
    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        _add(tar, "index.json", index)
        for blob in (layer, config, manifest):
            _add(tar, "blobs/sha256/" + _digest(blob).removeprefix("sha256:"), blob)
    tmp.replace(out)
    return _digest(manifest)


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    binary, name, out, *args = argv
    print(write_image(Path(binary), name, Path(out), ["/workload", *args]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
