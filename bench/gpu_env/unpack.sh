#!/usr/bin/env bash
# Runs on the GPU machine: extracts pack.sh's bundle into a site directory (no pip, no network), checks that
# the pipeline's Ray and MLflow modules import from it, and prints the one line that puts it on the path:
#
#   bash bench/gpu_env/unpack.sh [BUNDLE] [DEST] > /tmp/duplex-env.sh && . /tmp/duplex-env.sh
#
# BUNDLE defaults to bench/gpu_env/site.tar.xz, DEST to /tmp/duplex-site; the interpreter is $PYTHON
# (python3; it may carry flags). Only the export line goes to stdout; progress and errors go to stderr. Idempotent: a DEST
# already holding this bundle (same SHA-256) is kept; another bundle there is replaced through a temporary
# directory and a rename; a DEST that is not a bundle directory is never touched.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bundle=${1:-$here/site.tar.xz}
dest=${2:-/tmp/duplex-site}
python=${PYTHON:-python3}
stamp=.duplex-bundle-sha256
fail() { echo "error: $*" >&2; exit 1; }

[ -f "$bundle" ] || fail "no bundle at $bundle: build it where PyPI is reachable (bash bench/gpu_env/pack.sh) and carry it"
for tool in tar xz sha256sum; do
    command -v $tool >/dev/null || fail "$tool is not installed"
done
dest=$(realpath -m "$dest")
case $dest in /|/tmp|/usr|/usr/*|/etc|/etc/*|"$HOME") fail "refusing DEST $dest" ;; esac
sha=$(sha256sum "$bundle" | cut -d' ' -f1)

if [ -f "$dest/$stamp" ] && [ "$(cat "$dest/$stamp")" = "$sha" ]; then
    echo "$dest already holds this bundle" >&2
else
    [ ! -e "$dest" ] || [ -f "$dest/$stamp" ] || fail "$dest exists and is not a bundle directory: remove it or name another DEST"
    started=$(date +%s.%N)
    mkdir -p "$(dirname "$dest")"
    partial=$(mktemp -d "$dest.partial.XXXXXX")
    trap 'rm -rf "$partial"' EXIT
    xz -dc -T0 "$bundle" | tar -C "$partial" -xf - || fail "could not extract $bundle (truncated or not an xz tarball?)"
    echo "$sha" > "$partial/$stamp"
    rm -rf "$dest"
    mv "$partial" "$dest"
    trap - EXIT
    echo "extracted $bundle into $dest in $(awk -v s="$started" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }') s" >&2
fi

want=$(sed -n 's/^python //p' "$dest/DUPLEX_BUNDLE.txt")
have=$($python -c 'import sys; print("%d.%d" % sys.version_info[:2])') || fail "$python does not run"
[ "$want" = "$have" ] || fail "the bundle is for Python $want, $python is $have: rebuild with pack.sh --python-version $have"

path=$dest${PYTHONPATH:+:$PYTHONPATH}
# The modules the pipeline imports, each tried alone so that a failure names the missing package.
for module in ray ray.train ray.tune ray.data ray.dashboard.optional_deps mlflow \
        mlflow.store.tracking.sqlalchemy_store mlflow.pyfunc; do
    if ! error=$(PYTHONPATH=$path $python -c "import $module" 2>&1); then
        missing=$(printf '%s\n' "$error" | sed -n "s/.*No module named '\([^'.]*\).*/\1/p" | tail -1)
        echo "$error" | tail -3 >&2
        [ -z "$missing" ] || fail "import $module: '$missing' is neither in the bundle nor on this machine: take it out of HAVE in pack.sh and rebuild"
        fail "import $module failed (above)"
    fi
done
echo "ray, ray.train, ray.tune, ray.data, mlflow import from $dest" >&2

# The bundle's own requirements against the versions this machine has (pip check's "has requirement" lines
# for a bundled package; the skipped packages' "not installed" lines are pack.sh's choice, see SKIP there).
names=$(sed -n '2,$s/==.*//p' "$dest/DUPLEX_BUNDLE.txt" | tr 'A-Z_.' 'a-z--')
if PYTHONPATH=$path $python -m pip --version >/dev/null 2>&1; then
    conflicts=$( { PYTHONPATH=$path $python -m pip check 2>/dev/null || true; } | { grep "has requirement" || true; } |
        while read -r name rest; do
        if printf '%s\n' "$names" | grep -qx "$(echo "$name" | tr 'A-Z_.' 'a-z--')"; then echo "$name $rest"; fi
    done)
    [ -z "$conflicts" ] || printf 'warning: a bundled package wants another version of a package here:\n%s\n' "$conflicts" >&2
fi
echo "export PYTHONPATH=$dest\${PYTHONPATH:+:\$PYTHONPATH}"
