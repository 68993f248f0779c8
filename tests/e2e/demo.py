"""`make demo`: a local control plane, swapwise installed by Helm, one dry-run preview.

A newcomer's first look: what `kubectl apply --dry-run=server` shows for the example
sandbox pod in an opted-in namespace. Keeps running (with kubectl instructions) until
Ctrl-C when given --wait.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from tests.e2e.cluster import (
    PROFILE_LABEL,
    SWAP_LABEL,
    ControlPlane,
    ensure_binaries,
    wait_for_mutation,
)
from tests.e2e.install import REPO_ROOT, Installation
from webhook.engine.backing import PERMILLE_LABEL

EXAMPLE = REPO_ROOT / "examples" / "sandbox-pod.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--wait", action="store_true", help="keep everything up until Ctrl-C")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="swapwise-demo-") as tmp, ControlPlane(
        ensure_binaries()
    ) as cp:
        print("== control plane up: kube-apiserver", cp.server)
        # labelled as `swapwise node-agent` labels it: swap 2 x RAM is 2000 per mille
        cp.create_node("swap-1", "32Gi", "8", {SWAP_LABEL: "true", PERMILLE_LABEL: "2000"},
                       swap_capacity=64 << 30)
        cp.create_node("plain-1", "32Gi", "8")
        install = Installation(cp, Path(tmp), {"sandbox": {"swapRatio": 2}})
        install.upgrade()
        install.start_server()
        print(f"== helm install swapwise (webhook.url={install.values['webhook']['url']})")
        cp.create_namespace("demo", {PROFILE_LABEL: "sandbox"})
        wait_for_mutation(cp, "demo")
        print(f"== kubectl label namespace demo {PROFILE_LABEL}=sandbox")
        print(f"== kubectl apply --dry-run=server -n demo -o yaml -f {EXAMPLE.name}\n")
        out = cp.kubectl("apply", "--dry-run=server", "-n", "demo", "-o", "yaml",
                         "-f", str(EXAMPLE))
        print(out.stdout)
        print(out.stderr)
        if args.wait:
            cp.run_until_interrupted()
        install.stop_server()


if __name__ == "__main__":
    main()
