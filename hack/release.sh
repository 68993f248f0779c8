#!/usr/bin/env bash
# The release artifacts of one version, into dist/ (make release; .github/workflows/release.yml
# runs it on a tag and publishes what it makes):
#   dist/python/swapwise-<v>-py3-none-any.whl, swapwise-<v>.tar.gz
#                                   `pipx install <wheel>` gives the swapwise command
#   dist/chart/swapwise-<v>.tgz     `helm push dist/chart/swapwise-<v>.tgz oci://REGISTRY/charts`
#   dist/image/swapwise-image-<v>.tar
#                                   OCI archive of the image localhost/swapwise:<v> (hack/build-image.sh)
#   dist/SHA256SUMS
#
# The version is pyproject.toml's; the chart's version and appVersion and webhook/__init__.py
# must say the same, and so must the tag being released (SWAPWISE_RELEASE_TAG=v<version>, as
# CI passes it), or nothing is built.
#
# Usage: hack/release.sh [--local-base] [--no-image]
#   --local-base  the image FROM a base made from Debian's packages (as make image LOCAL_BASE=1)
#   --no-image    everything but the image (a machine without buildah or root)
#   DIST          output directory (default dist)
#   HELM          the helm to package the chart with (default: helm on PATH, else the one
#                 tests/e2e/build-control-plane.sh builds and caches)
#   PYTHON        the Python with `build` installed (default .venv/bin/python)
#   BUILD_IMAGE   the image builder (default hack/build-image.sh; tests/test_release.py
#                 stands one in to check what it is given)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
dist=${DIST:-dist}
[[ $dist == /* ]] || dist=$repo/$dist
python=${PYTHON:-.venv/bin/python}
image_args=()
with_image=true
for arg in "$@"; do
  case $arg in
    --local-base) image_args+=(--local-base) ;;
    --no-image) with_image=false ;;
    *) echo "release: unknown argument $arg (--local-base, --no-image)" >&2; exit 2 ;;
  esac
done
step() { printf '==> %s\n' "$*"; }

# -- one version everywhere
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -1)
chart_version=$(sed -n 's/^version: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' charts/swapwise/Chart.yaml)
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' charts/swapwise/Chart.yaml)
module_version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' webhook/__init__.py)
problems=()
[[ -n $version ]] || problems+=("pyproject.toml has no version")
[[ $chart_version == "$version" ]] ||
  problems+=("charts/swapwise/Chart.yaml version is ${chart_version:-missing}")
[[ $app_version == "$version" ]] ||
  problems+=("charts/swapwise/Chart.yaml appVersion is ${app_version:-missing}")
[[ $module_version == "$version" ]] ||
  problems+=("webhook/__init__.py __version__ is ${module_version:-missing}")
if [[ -n ${SWAPWISE_RELEASE_TAG:-} && $SWAPWISE_RELEASE_TAG != "v$version" ]]; then
  problems+=("the tag is $SWAPWISE_RELEASE_TAG")
fi
if (( ${#problems[@]} )); then
  {
    echo "release: pyproject.toml says version ${version:-?}, but:"
    printf '  %s\n' "${problems[@]}"
    echo "nothing was built: give them all the same version (and tag v${version:-?})"
  } >&2
  exit 1
fi

rm -rf "$dist"
mkdir -p "$dist/python" "$dist/chart"

# -- the wheel and the sdist (PyPA's build, in an isolated environment from pyproject.toml)
step "python: wheel and sdist of swapwise $version"
"$python" -m build --outdir "$dist/python" . >"$dist/python/build.log" 2>&1 ||
  { tail -30 "$dist/python/build.log" >&2; exit 1; }
rm -f "$dist/python/build.log"

# -- the chart, as helm push takes it (an OCI registry) and as a chart repository serves it
cached_helm() { ls -d "$HOME"/.cache/swapwise/k8s/v1.34.*/bin/helm 2>/dev/null | head -1; }
helm=${HELM:-$(command -v helm || cached_helm || true)}
if [[ -z $helm ]]; then
  tests/e2e/build-control-plane.sh helm >&2
  helm=$(cached_helm)
fi
step "chart: swapwise $version ($("$helm" version --short))"
"$helm" lint charts/swapwise >/dev/null
"$helm" package charts/swapwise --destination "$dist/chart" >/dev/null

# -- the image, an OCI archive tagged with the version
if $with_image; then
  mkdir -p "$dist/image"
  OUT="$dist/image/swapwise-image-$version.tar" "${BUILD_IMAGE:-hack/build-image.sh}" \
    "${image_args[@]}"
  rm -f "$dist/image/swapwise-image-$version.tar.stamp"
fi

(cd "$dist" && find . -type f ! -name SHA256SUMS | sort | xargs sha256sum) >"$dist/SHA256SUMS"
step "release $version in $dist/:"
(cd "$dist" && find . -type f | sort | sed 's/^\.\//  /')
