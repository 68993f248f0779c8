"""`make release` (hack/release.sh) and the workflow that publishes what it makes.

What runs here: the version check, the wheel and sdist (PyPA's build, from PyPI's setuptools)
and the installed command of the wheel, the chart package, and how the image builder is
called (a stand-in: the real hack/build-image.sh needs root, buildah and a base image; the
real-node suite builds and runs that image).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tomllib
import venv
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
WORKFLOW = REPO / ".github" / "workflows" / "release.yml"


def release(dist: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REPO / "hack" / "release.sh"), *args], cwd=REPO,
                          env={**os.environ, "DIST": str(dist), **env},
                          capture_output=True, text=True, timeout=600, check=False)


def test_a_tag_that_is_not_the_version_builds_nothing(tmp_path: Path) -> None:
    out = release(tmp_path / "dist", "--no-image", SWAPWISE_RELEASE_TAG="v9.9.9")
    assert out.returncode == 1
    assert out.stderr == (f"release: pyproject.toml says version {VERSION}, but:\n"
                          "  the tag is v9.9.9\n"
                          f"nothing was built: give them all the same version (and tag "
                          f"v{VERSION})\n")
    assert not (tmp_path / "dist").exists()


def test_every_file_that_states_the_version_states_the_same() -> None:
    chart = yaml.safe_load((REPO / "charts" / "swapwise" / "Chart.yaml").read_text())
    from webhook import __version__

    assert chart["version"] == chart["appVersion"] == __version__ == VERSION


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One release without the image, its builder a stand-in that records its call."""
    from tests.chart.chartlib import find_helm

    root = tmp_path_factory.mktemp("release")
    stand_in = root / "build-image"
    stand_in.write_text('#!/bin/sh\nprintf "%s\\n" "$OUT" "$@" > "$(dirname "$0")/called"\n'
                        'echo "an OCI archive" > "$OUT"\ntouch "$OUT.stamp"\n')
    stand_in.chmod(0o755)
    out = release(root / "dist", "--local-base", HELM=str(find_helm()),
                  BUILD_IMAGE=str(stand_in), SWAPWISE_RELEASE_TAG=f"v{VERSION}")
    assert out.returncode == 0, out.stdout + out.stderr
    return root


def test_release_makes_each_artifact_with_its_checksum(released: Path) -> None:
    dist = released / "dist"
    files = sorted(str(p.relative_to(dist)) for p in dist.rglob("*") if p.is_file())
    assert files == ["SHA256SUMS", f"chart/swapwise-{VERSION}.tgz",
                     f"image/swapwise-image-{VERSION}.tar",
                     f"python/swapwise-{VERSION}-py3-none-any.whl",
                     f"python/swapwise-{VERSION}.tar.gz"]
    sums = dict(reversed(line.split("  ")) for line in (dist / "SHA256SUMS").read_text()
                .splitlines())
    for name in files[1:]:
        assert sums[f"./{name}"] == hashlib.sha256((dist / name).read_bytes()).hexdigest()
    # The image: hack/build-image.sh's archive, named with the version, its stamp not shipped.
    called = (released / "called").read_text().splitlines()
    assert called == [str(dist / "image" / f"swapwise-image-{VERSION}.tar"), "--local-base"]


def test_the_sdist_is_the_package_without_the_tests(released: Path) -> None:
    with tarfile.open(released / "dist" / "python" / f"swapwise-{VERSION}.tar.gz") as sdist:
        names = sdist.getnames()
    top = f"swapwise-{VERSION}"
    assert {f"{top}/pyproject.toml", f"{top}/README.md", f"{top}/webhook/cli/__init__.py",
            f"{top}/webhook/base/upstream.py"} <= set(names)
    assert not [n for n in names if n.startswith(f"{top}/tests")]


def test_the_wheel_installed_gives_the_swapwise_command(released: Path) -> None:
    """What `pipx install` does: a venv of its own, the wheel in it, its console script on
    PATH. The dependencies come from this venv (a path line, so its editable install of the
    checkout is not taken up): the wheel's own webhook package must be the one that runs."""
    target = released / "venv"
    venv.create(target, with_pip=False)
    wheel = released / "dist" / "python" / f"swapwise-{VERSION}-py3-none-any.whl"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(target / "bin" / "python"),
                    "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
                   check=True, timeout=300)
    [site] = (target / "lib").glob("python3*/site-packages")
    ours = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "deps.pth").write_text("\n".join(ours) + "\n")
    command = target / "bin" / "swapwise"
    # From outside the checkout, whose webhook/ a `python -c` would import first.
    out = subprocess.run([str(command), "--version"], capture_output=True, text=True,
                         timeout=60, check=True, cwd=released)
    assert out.stdout == f"swapwise {VERSION}\n"
    where = subprocess.run([str(target / "bin" / "python"), "-c",
                            "import webhook; print(webhook.__file__)"],
                           capture_output=True, text=True, timeout=60, check=True,
                           cwd=released).stdout
    assert where.startswith(str(site)), where
    policy = (REPO / "examples" / "policy.yaml").read_text()
    check = subprocess.run([str(command), "policy", "check", "-"], capture_output=True,
                           text=True, timeout=60, cwd=released, input=policy)
    assert check.returncode == 0 and "valid" in check.stdout, check.stderr


def test_the_chart_package_is_the_chart_at_the_version(released: Path) -> None:
    from tests.chart.chartlib import find_helm

    package = released / "dist" / "chart" / f"swapwise-{VERSION}.tgz"
    shown = subprocess.run([str(find_helm()), "show", "chart", str(package)],
                           capture_output=True, text=True, timeout=120, check=True).stdout
    chart = yaml.safe_load(shown)
    assert (chart["name"], chart["version"], chart["appVersion"]) == ("swapwise", VERSION,
                                                                      VERSION)
    rendered = subprocess.run([str(find_helm()), "template", "swapwise", str(package),
                               "-n", "swapwise"], capture_output=True, text=True, timeout=120)
    assert rendered.returncode == 0 and "MutatingWebhookConfiguration" in rendered.stdout


def _steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    [job] = workflow["jobs"].values()
    steps: list[dict[str, Any]] = job["steps"]
    return steps


def test_the_release_workflow_builds_with_make_release_on_a_tag_and_publishes_it() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    # YAML 1.1 reads the key `on` as true.
    trigger = workflow.get("on", workflow.get(True))
    assert trigger == {"push": {"tags": ["v*"]}}
    [job] = workflow["jobs"].values()
    assert job["env"]["SWAPWISE_RELEASE_TAG"] == "${{ github.ref_name }}"
    runs = "\n".join(step.get("run", "") for step in _steps(workflow))
    assert "make release" in runs
    # Each artifact make release writes is what a later step publishes.
    assert "dist/image/swapwise-image-$VERSION.tar" in runs and "skopeo copy" in runs
    assert 'helm push "dist/chart/swapwise-$VERSION.tgz" "oci://ghcr.io/$OWNER/charts"' in runs
    assert "dist/SHA256SUMS dist/python/* dist/chart/* dist/image/*" in runs
    makefile = (REPO / "Makefile").read_text()
    assert "release: venv\n\thack/release.sh" in makefile
