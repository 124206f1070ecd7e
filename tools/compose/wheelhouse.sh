#!/usr/bin/env bash
# The wheelhouse deploy/compose/Dockerfile installs from, built on this host where pip reaches the index
# (pip inside a container may not: a TLS-intercepting proxy's CA is the host's only):
#
#     tools/compose/wheelhouse.sh [DEST]      (DEST defaults to deploy/compose/wheels, git-ignored)
#
# - DEST/deps: every dependency of pyproject.toml at constraints.txt's pins, as wheels for this Python
#   (the venv's, 3.11: the CPU image's Debian bookworm has 3.11 too; deps/.python says which, and an image
#   with another Python installs from the index instead). Rebuilt only when constraints.txt,
#   pyproject.toml or the Python version changed (DEST/deps/.key), so docker's layer cache holds.
# - DEST/project: the mcpmesh wheel, built every time from the working tree's files (tracked and untracked,
#   not ignored) copied to a scratch folder, offline, with fixed timestamps: the same tree gives the same wheel.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dest="${1:-$root/deploy/compose/wheels}"
python="${PYTHON:-$root/.venv/bin/python}"
[[ -x "$python" ]] || { echo "wheelhouse: no $python (make setup)" >&2; exit 1; }
mkdir -p "$dest/deps" "$dest/project"
log="$dest/.wheelhouse.log"  # pip's own output; its tail is shown when a step fails
: >"$log"
quiet() { "$@" >>"$log" 2>&1 || { tail -20 "$log" >&2; echo "wheelhouse: failed: $*; see $log" >&2; return 1; }; }

version="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
key="$( { cat "$root/constraints.txt" "$root/pyproject.toml"; echo "python $version"; } | sha256sum | cut -c1-32)"
if [[ "$(cat "$dest/deps/.key" 2>/dev/null || true)" == "$key" ]] && ls "$dest"/deps/*.whl >/dev/null 2>&1; then
    echo "wheelhouse: deps up to date ($(find "$dest/deps" -name '*.whl' | wc -l) wheels for Python $version)"
else
    scratch="$(mktemp -d "$dest/.deps.XXXXXX")"
    trap 'rm -rf "$scratch"' EXIT
    "$python" - "$root/pyproject.toml" >"$scratch/requirements.txt" <<'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))
EOF
    echo "wheelhouse: downloading the dependencies' wheels for Python $version (pip wheel -c constraints.txt)"
    quiet "$python" -m pip wheel -q --disable-pip-version-check -c "$root/constraints.txt" \
        -r "$scratch/requirements.txt" -w "$scratch/wheels"
    find "$dest/deps" -mindepth 1 ! -name .gitignore -delete
    mv "$scratch"/wheels/*.whl "$dest/deps/"
    echo "$key" >"$dest/deps/.key"
    echo "$version" >"$dest/deps/.python"  # the Dockerfile uses the wheelhouse only for this Python
    echo "wheelhouse: $(find "$dest/deps" -name '*.whl' | wc -l) wheels in $dest/deps ($(du -sh "$dest/deps" | cut -f1))"
fi

src="$(mktemp -d)"
trap 'rm -rf "$src" "${scratch:-}"' EXIT
(cd "$root" && git ls-files -z -co --exclude-standard -- pyproject.toml README.md libs services clients tools/devcluster |
    while IFS= read -r -d '' f; do if [[ -f "$f" ]]; then cp --parents -p "$f" "$src/"; fi; done)
find "$dest/project" -mindepth 1 ! -name .gitignore -delete
SOURCE_DATE_EPOCH=315532800 quiet "$python" -m pip wheel -q --disable-pip-version-check --no-deps \
    --no-build-isolation -w "$dest/project" "$src"
echo "wheelhouse: $(basename "$dest"/project/mcpmesh-*.whl)"
