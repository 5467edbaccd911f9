#!/usr/bin/env bash
# Export the specscope package folders of one commit into DIR, for `benchmarks/tracer_overhead.py --base-tree DIR`
# (the recorder of an older commit measured beside the working tree's, each in its own worker process).
#   bash scripts/base_tree.sh COMMIT DIR        e.g.  bash scripts/base_tree.sh 25cc3e3 .bench/base-25cc3e3
# Only tracer/ backend/ ui/ integrations/ and pyproject.toml (git archive, so backend/archive_commit.txt names the
# commit); DIR also gets COMMIT (the full hash). DIR should be git-ignored (.bench/ is) so it travels with the
# working tree to a GPU host; the script refuses a copy of 5 MB or more. Read-only on the repository.
set -euo pipefail
commit=${1:?usage: base_tree.sh COMMIT DIR}
dir=${2:?usage: base_tree.sh COMMIT DIR}
case $dir in /*) ;; *) dir=$PWD/$dir ;; esac  # DIR as the caller named it, before moving to the repository root
root=$(git rev-parse --show-toplevel)
cd "$root"
full=$(git rev-parse --verify "$commit^{commit}")
# Replace only an earlier copy (it has COMMIT) or an empty folder: never whatever else DIR might name.
if [ -e "$dir" ] && [ ! -f "$dir/COMMIT" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
  echo "base_tree: $dir exists and is not an earlier base tree (no COMMIT file): refusing to replace it" >&2
  exit 1
fi
rm -rf "$dir"
mkdir -p "$dir"
git archive --format=tar "$full" tracer backend ui integrations pyproject.toml | tar -x -C "$dir"
echo "$full" >"$dir/COMMIT"
filled=$(cat "$dir/backend/archive_commit.txt" 2>/dev/null || echo "(none)")
kb=$(du -sk "$dir" | cut -f1)
if [ "$kb" -ge 5120 ]; then
  echo "base_tree: $dir is $kb KB (limit 5 MB): too large to travel" >&2
  exit 1
fi
if ! git check-ignore -q "$dir"; then
  echo "base_tree: warning: $dir is not git-ignored (it would show up as untracked files)" >&2
fi
echo "base_tree: $full -> $dir ($kb KB; backend/archive_commit.txt: $filled; working tree on $(git rev-parse --short HEAD))"
