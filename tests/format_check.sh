#!/usr/bin/env bash
# Fails when a C++ file of the tree differs from what clang-format makes of
# it under .clang-format (Google style, 100 columns), naming each file.
# Fix with: git ls-files '*.h' '*.cc' '*.c' | xargs clang-format -i
# usage: format_check.sh SOURCE_ROOT | --self-test
set -euo pipefail
if [[ "${1:-}" == "--self-test" ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  cp "$(dirname "$0")/../.clang-format" "$tmp/"
  printf 'int  main( ) {return 0;}\n' >"$tmp/bad.cc"
  if clang-format --dry-run --Werror "$tmp/bad.cc" 2>/dev/null; then
    echo "format self-test: an unformatted file passed"
    exit 1
  fi
  echo "format self-test: an unformatted file is caught"
  exit 0
fi
cd "$1"
mapfile -t files < <(git ls-files '*.h' '*.cc' '*.c' '*.h.in')
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]} > 0)); then
  printf 'not formatted: %s\n' "${bad[@]}"
  echo "${#bad[@]} of ${#files[@]} files differ from clang-format (.clang-format)"
  exit 1
fi
echo "format: all ${#files[@]} C++ files match .clang-format"
