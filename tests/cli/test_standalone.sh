#!/usr/bin/env bash
# test_standalone.sh -- the repository stands alone: no file in it cites a
# document that lives outside the repository, none names a path of the
# machine it was written on, and every "docs/NAME.md §N.M" it cites exists.
# What the code relies on is written in docs/ (docs/deepspeed.md,
# docs/tinker-protocol.md, ...); cite those.
#
# Checked: every file git knows (tracked, plus untracked files that are not
# ignored), or, without git, every file under the source tree except .git and
# build directories.  Binary files are skipped.  On failure it prints each
# offending line as FILE:LINE: TEXT and exits 1.
#
# Usage: bash tests/cli/test_standalone.sh [ignored arguments]
# (CTest passes the zdp binary and mpiexec to every CLI test; this one needs
# neither.)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1

# The patterns are spelled with a bracket ([T]INKER) so that this file does
# not match itself.
patterns=(
  '([T]INKER|[S]EMANTICS|[D]ESIGN|[P]ITFALLS|[S]TYLE)\.md'  # design notes kept outside the repository
  '\b[S]EMANTICS\b'                                         # the same, cited without ".md"
  '\b[P]ITFALLS\b'
  '\.\./[s]hared'                                           # the folder they live in
  '/[w]ork/'                                                # machine paths
  '/[r]oot/'
)
regex=$(IFS='|'; echo "${patterns[*]}")

list_files_() {
  if command -v git >/dev/null 2>&1 && git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard
  else
    # No git (a source tarball): skip .git and anything that looks like a
    # CMake build directory.
    find . \( -name .git -o -name 'build*' -o -exec test -e '{}/CMakeCache.txt' \; \) -prune \
      -o -type f -print0
  fi
}

n_files=0
hits=$(mktemp)
trap 'rm -f "$hits"' EXIT
while IFS= read -r -d '' f; do
  f=${f#./}
  [ -f "$f" ] || continue # tracked but deleted in the working tree
  n_files=$((n_files + 1))
  grep -nIHE -- "$regex" "$f" >>"$hits"
done < <(list_files_)

# Every section a file cites as "NAME.md §N" or "NAME.md §N.M" (docs/NAME.md)
# exists: a heading "## N. ..." or "### N.M ...".  tests/serve/tinker_sdk.py
# cites docs/tinker-protocol.md by bare "§N.M".
while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue
  {
    grep -noIE '[A-Za-z0-9_-]+\.md §[0-9]+(\.[0-9]+)?((, | and |/)§[0-9]+(\.[0-9]+)?)*' "$f" || true
    if [ "$f" = tests/serve/tinker_sdk.py ]; then
      grep -noE '§[0-9]+(\.[0-9]+)?' "$f" | sed 's/:§/:tinker-protocol.md §/' || true
    fi
  } | while IFS= read -r hit; do
    line=${hit%%:*} cite=${hit#*:}
    doc=docs/${cite%%.md*}.md
    for sec in $(grep -oE '§[0-9]+(\.[0-9]+)?' <<<"$cite" | tr -d '§'); do
      if [ ! -f "$doc" ] || ! grep -qE "^#+ ${sec//./\\.}[. ]" "$doc"; then
        echo "$f:$line: cites $doc §$sec, which has no such section" >>"$hits"
      fi
    done
  done
done < <(list_files_)

if [ "$n_files" -eq 0 ]; then
  echo "test_standalone: FAIL: found no files to check under $root" >&2
  exit 1
fi
if [ -s "$hits" ]; then
  echo "test_standalone: FAIL: $(wc -l <"$hits") problem(s): a document outside the repository, a" \
       "machine path, or a docs/ section that does not exist is cited; cite the docs/ page and section" \
       "that says it instead (docs/deepspeed.md for DeepSpeed's rules, docs/tinker-protocol.md for the" \
       "Tinker protocol, docs/architecture.md for the design):" >&2
  sed 's/^/  /' "$hits" >&2
  exit 1
fi
echo "test_standalone: ok ($n_files files: no outside document or machine path cited, every docs/ section cited exists)"
