#!/usr/bin/env bash
# Builds, on a machine with PyPI, the bundle of Python packages the pipeline needs on the lent GPU machine
# and that machine lacks (Ray and MLflow and what they pull in), for CPython 3.12 manylinux x86_64 by
# default: wheels resolved and fetched by pip, unzipped into one site directory (no pip needed there),
# pruned, tarred with xz -9. unpack.sh extracts it there. See bench/README.md, "The GPU machine".
#
#   bash bench/gpu_env/pack.sh [--python-version 3.12] [--out bench/gpu_env/site.tar.xz]
#
# --python-version 3.11 builds the same for this machine's Python (the local check of the mechanism).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
python_version=3.12
out=$here/site.tar.xz
while [ $# -gt 0 ]; do
    case $1 in
        --python-version) python_version=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) echo "usage: $0 [--python-version X.Y] [--out FILE.tar.xz]" >&2; exit 2 ;;
    esac
done
[[ $python_version =~ ^3\.[0-9]+$ ]] || { echo "error: --python-version wants X.Y, got $python_version" >&2; exit 2; }
tag=cp${python_version/./}
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")

# What the GPU machine already has among what Ray and MLflow pull in (its image's package list,
# /work/.library/device/KINDS.md, read 2026-11-17). Installed versions there are not checked here: the exact
# set must be confirmed on the GPU by trying (unpack.sh imports the pipeline's modules and runs pip check
# on the bundle's requirements); a package found missing there moves out of this list.
HAVE="aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi charset-normalizer click cloudpickle
contourpy cycler filelock fonttools frozenlist fsspec grpcio h11 idna jinja2 joblib kiwisolver markupsafe
matplotlib msgpack multidict narwhals numpy packaging pandas pillow prometheus-client propcache protobuf
pyarrow pyparsing python-dateutil pyyaml requests scikit-learn scipy six threadpoolctl typing-extensions
urllib3 werkzeug wrapt yarl zipp"

# Pulled in but never imported by the pipeline or its tests (a lazy import only, or a command we never run):
#   py-spy                       Ray's `ray stack` / the dashboard's profiling buttons (a 3 MB binary)
#   virtualenv, distlib, python-discovery   runtime_env venvs (pip/uv/conda envs); our runs pass none
#   docker                       `mlflow models build-docker` and MLflow Projects
#   gunicorn, huey               `mlflow server`'s process manager and job queue (we track into sqlite)
#   skops                        MLflow's scikit-learn flavour
SKIP="py-spy virtualenv distlib python-discovery docker gunicorn huey skops"

# Parts of the bundle's packages the pipeline never imports (paths in the site directory):
#   ray/jars                Java workers (cross-language); 33 MB
#   ray/rllib               RLlib, reinforcement learning; 17 MB
#   ray/llm                 Ray's LLM serving and batch inference (vLLM)
#   mlflow/server/js        the built web UI, served only by `mlflow server` / `mlflow ui`; 27 MB
# ray/serve stays: pipeline/serve.py imports it at module level and tests/pipeline/test_serve.py imports that.
PRUNE="ray/jars ray/rllib ray/llm mlflow/server/js"

ray_version=$(sed -n 's/^ray\[[a-z,]*\]==\([0-9.]*\).*/\1/p' "$root/requirements.txt")
mlflow_version=$(sed -n 's/^mlflow\(\[[a-z,]*\]\)\?==\([0-9.]*\).*/\2/p' "$root/requirements.txt")
[ -n "$ray_version" ] && [ -n "$mlflow_version" ] || { echo "error: no ray/mlflow pin in requirements.txt" >&2; exit 1; }
# `default`: the dashboard (cluster/connect.py starts one: its State API cleans up Ray Train's placement
# groups, and Tune's early-stopped trials leak theirs without it: ../shared/RAY_NOTES.md). `data`: Ray Data.
requirements=("ray[default,data,train,tune]==$ray_version" "mlflow==$mlflow_version")

pip_python=${PIP_PYTHON:-$root/.venv/bin/python}
[ -x "$pip_python" ] || pip_python=python3
"$pip_python" -m pip --version >/dev/null 2>&1 || { echo "error: no pip for $pip_python (set PIP_PYTHON)" >&2; exit 1; }
for tool in tar xz git; do
    command -v $tool >/dev/null || { echo "error: $tool is not installed" >&2; exit 1; }
done

target=(--only-binary=:all: --implementation cp --python-version "$python_version" --abi "$tag")
for platform in manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux1 manylinux_2_5; do
    target+=(--platform "${platform}_x86_64")
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "resolving ${requirements[*]} for CPython $python_version manylinux x86_64" >&2
"$pip_python" -m pip install --dry-run --ignore-installed --quiet --target "$tmp/never" --report "$tmp/report.json" \
    "${target[@]}" "${requirements[@]}" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
python3 "$here/wheels.py" select "$tmp/report.json" "$HAVE" "$SKIP" > "$tmp/bundle.txt"
echo "fetching $(wc -l < "$tmp/bundle.txt") wheels: $(tr '\n' ' ' < "$tmp/bundle.txt")" >&2
"$pip_python" -m pip download --no-deps --quiet -d "$tmp/wheels" "${target[@]}" -r "$tmp/bundle.txt" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)

python3 "$here/wheels.py" unpack "$tmp/wheels" "$tmp/site" "$PRUNE"
{
    echo "python $python_version"
    cat "$tmp/bundle.txt"
} > "$tmp/site/DUPLEX_BUNDLE.txt"
echo "site directory: $(du -sm "$tmp/site" | cut -f1) MiB unpacked; compressing (xz -9)" >&2
tar -C "$tmp/site" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - . | xz -9 -T0 > "$tmp/site.tar.xz"
mkdir -p "$(dirname "$out")"
mv "$tmp/site.tar.xz" "$out"

# What travels to the GPU machine: the tracked and untracked-not-ignored files, plus what `carry` names.
tree_bytes=$(cd "$root" && git ls-files -z -co --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
bundle_bytes=$(stat -c %s "$out")
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
budget=$((60 * 1048576 - tree_bytes))
echo "bundle $out: $(mib "$bundle_bytes") MiB"
echo "working tree: $(mib "$tree_bytes") MiB; budget 60 MiB - tree = $(mib "$budget") MiB"
if [ "$bundle_bytes" -gt "$budget" ]; then
    echo "error: the bundle is over the budget" >&2
    exit 1
fi
