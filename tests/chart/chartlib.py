"""Helpers for the Helm chart tests: find (or build) helm, render the chart, pick objects.

Which Helm: SWAPWISE_HELM=3 (default, v3.19.5) or 4 (v4.3.1), the setting the e2e installs
read too (tests/e2e/cluster.py). The binary comes from, in order: $HELM;
${SWAPWISE_K8S_BIN:-~/.cache/swapwise/k8s/v1.34.4/bin}/helm (or helm4), built by
tests/e2e/build-control-plane.sh; or it is built here with `go install` into
~/.cache/swapwise/helm-<version>/. When none of that works the tests FAIL: they never skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "swapwise"
# SWAPWISE_HELM -> (binary name in the control plane's bin dir, version, Go package)
HELMS = {
    "3": ("helm", "v3.19.5", "helm.sh/helm/v3/cmd/helm"),
    "4": ("helm4", "v4.3.1", "helm.sh/helm/v4/cmd/helm"),
}
HELM_MAJOR = os.environ.get("SWAPWISE_HELM") or "3"
if HELM_MAJOR not in HELMS:
    raise RuntimeError(f"SWAPWISE_HELM={HELM_MAJOR}: expected 3 or 4")
HELM_NAME, HELM_VERSION, HELM_PACKAGE = HELMS[HELM_MAJOR]
KUBE_VERSION = "1.34.4"
DEFAULT_BIN = Path.home() / ".cache" / "swapwise" / "k8s" / f"v{KUBE_VERSION}" / "bin"
RELEASE = "sw"
NAMESPACE = "swapwise-system"

# Kinds that come from CRDs: kubernetes-validate has no schema for them, so the tests
# assert their shape instead.
CRD_GROUPS = ("cert-manager.io/", "monitoring.coreos.com/")

Obj = dict[str, Any]


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def go_cache_env() -> dict[str, str]:
    """GOMODCACHE and GOCACHE as tests/go-env.sh sets them for the build scripts."""
    root = Path(
        os.environ.get("SWAPWISE_GO_CACHE", Path.home() / ".cache" / "swapwise" / "go")
    )
    return {"GOMODCACHE": str(root / "mod"), "GOCACHE": str(root / "build")}


def helm_major(helm: Path) -> str:
    """"3" or "4": what `helm version` of this binary says."""
    out = subprocess.run([str(helm), "version", "--template={{.Version}}"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return out.strip().lstrip("v").split(".")[0]


def find_helm() -> Path:
    """Locate the selected helm, building it with `go install` if needed; raise with a
    reason if not."""
    env = os.environ.get("HELM")
    if env:
        path = Path(env)
        if not _executable(path):
            raise RuntimeError(f"HELM={env} is not an executable file")
        return path
    bindir = Path(os.environ.get("SWAPWISE_K8S_BIN", DEFAULT_BIN))
    if _executable(bindir / HELM_NAME):
        return bindir / HELM_NAME
    own = Path.home() / ".cache" / "swapwise" / f"helm-{HELM_VERSION}"
    if _executable(own / "helm"):
        return own / "helm"
    go = shutil.which("go")
    if go is None:
        raise RuntimeError(
            f"no {HELM_NAME}: set HELM, build it into {bindir} with "
            "tests/e2e/build-control-plane.sh, or install Go so the tests can build it"
        )
    own.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [go, "install", f"{HELM_PACKAGE}@{HELM_VERSION}"],
        env={**os.environ, **go_cache_env(), "GOBIN": str(own), "CGO_ENABLED": "0"},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0 or not _executable(own / "helm"):
        raise RuntimeError(f"building helm {HELM_VERSION} failed:\n{proc.stderr[-4000:]}")
    return own / "helm"


class HelmError(Exception):
    def __init__(self, returncode: int, stderr: str) -> None:
        super().__init__(stderr)
        self.returncode = returncode
        self.stderr = stderr


class Chart:
    """Runs helm against charts/swapwise with values given as Python data."""

    def __init__(self, helm: Path, workdir: Path, kube_version: str = KUBE_VERSION) -> None:
        """``kube_version``: the cluster version `helm template` and `helm lint` assume."""
        self.helm = helm
        self.workdir = workdir
        self.kube_version = kube_version
        self._n = 0

    def _values_file(self, values: Obj | None) -> list[str]:
        if not values:
            return []
        self._n += 1
        path = self.workdir / f"values-{self._n}.yaml"
        path.write_text(yaml.safe_dump(values, sort_keys=False))
        return ["--values", str(path)]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.helm), *args], capture_output=True, text=True, timeout=120, check=False
        )

    def template_text(
        self,
        values: Obj | None = None,
        *,
        extra: Sequence[str] = (),
        release: str = RELEASE,
        namespace: str = NAMESPACE,
        chart: Path = CHART,
    ) -> str:
        proc = self.run(
            "template",
            release,
            str(chart),
            "--namespace",
            namespace,
            "--kube-version",
            self.kube_version,
            *self._values_file(values),
            *extra,
        )
        if proc.returncode != 0:
            raise HelmError(proc.returncode, proc.stderr)
        return proc.stdout

    def render(self, values: Obj | None = None, **kw: Any) -> list[Obj]:
        """`helm template` -> the rendered objects, in output order."""
        text = self.template_text(values, **kw)
        return [doc for doc in yaml.safe_load_all(text) if doc]

    def error(self, values: Obj | None = None, **kw: Any) -> str:
        """`helm template` that must fail -> its stderr."""
        try:
            self.template_text(values, **kw)
        except HelmError as exc:
            return exc.stderr
        raise AssertionError(f"helm template accepted values it should refuse: {values!r}")

    def lint(self, values: Obj | None = None) -> subprocess.CompletedProcess[str]:
        return self.run(
            "lint",
            "--strict",
            str(CHART),
            "--kube-version",
            self.kube_version,
            "--namespace",
            NAMESPACE,
            *self._values_file(values),
        )

    def notes(self, values: Obj | None = None, *, namespace: str = NAMESPACE) -> str:
        """Render templates/NOTES.txt, which `helm template` leaves out.

        A copy of the chart gets one more template that renders NOTES.txt with `tpl`
        into a ConfigMap.
        """
        self._n += 1
        copy = self.workdir / f"chart-{self._n}" / "swapwise"
        shutil.copytree(CHART, copy)
        # .Files cannot read templates/, so the text goes next to Chart.yaml.
        shutil.copy(copy / "templates" / "NOTES.txt", copy / "notes.tpl")
        (copy / "templates" / "zz-notes.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
            'data: {notes: {{ tpl (.Files.Get "notes.tpl") . | toJson }}}\n'
        )
        text = self.template_text(
            values,
            chart=copy,
            namespace=namespace,
            extra=["--show-only", "templates/zz-notes.yaml"],
        )
        return str(yaml.safe_load(text)["data"]["notes"])


# ---- picking objects -------------------------------------------------------------------


def kinds(objs: Iterable[Obj]) -> list[str]:
    return [o["kind"] for o in objs]


def all_of(objs: Iterable[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: Iterable[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in all_of(objs, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def webhooks(objs: Iterable[Obj]) -> list[Obj]:
    return list(one(objs, "MutatingWebhookConfiguration")["webhooks"])


def container(objs: Iterable[Obj]) -> Obj:
    containers = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def is_crd_kind(obj: Obj) -> bool:
    return str(obj["apiVersion"]).startswith(CRD_GROUPS)


# ---- later steps: against a real API server (not wired into the suite yet) ---------------


def server_side_dry_run(
    objs: Sequence[Obj], *, kubectl: str | Path, kubeconfig: str | Path
) -> subprocess.CompletedProcess[str]:
    """`kubectl apply --dry-run=server` of rendered objects against a live API server.

    Creates the namespaces the objects live in first (a dry run cannot create into a
    namespace that does not exist). Meant for the e2e control plane.
    """
    namespaces = sorted({o["metadata"]["namespace"] for o in objs if "namespace" in o["metadata"]})
    base = [str(kubectl), "--kubeconfig", str(kubeconfig)]
    for ns in namespaces:
        manifest = yaml.safe_dump(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        )
        subprocess.run(
            [*base, "apply", "-f", "-"], input=manifest, text=True, check=True, capture_output=True
        )
    return subprocess.run(
        [*base, "apply", "--dry-run=server", "-o", "yaml", "-f", "-"],
        input=yaml.safe_dump_all(objs),
        text=True,
        capture_output=True,
        check=False,
    )


def helm_upgrade_install(
    helm: str | Path,
    *,
    kubeconfig: str | Path,
    values: Obj | None = None,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    extra: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """`helm upgrade --install` of charts/swapwise into a live cluster (e2e use, not wired)."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        yaml.safe_dump(values or {}, fh)
    try:
        return subprocess.run(
            [
                str(helm),
                "upgrade",
                "--install",
                release,
                str(CHART),
                "--namespace",
                namespace,
                "--create-namespace",
                "--kubeconfig",
                str(kubeconfig),
                "--values",
                fh.name,
                *extra,
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
    finally:
        os.unlink(fh.name)
