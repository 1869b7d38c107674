#!/usr/bin/env bash
# test_layering.sh -- the library's layering holds (docs/architecture.md,
# "Layers" and "Public headers"):
#   - no object file references a symbol defined in a higher layer
#     (tests/cli/layers.py), and nothing under src/ includes the umbrella
#     zdp/zdp.h;
#   - when the zdp binary links libzdp.so (-DBUILD_SHARED_LIBS=ON), the
#     library exports exactly the functions declared ZDP_API in include/zdp/
#     and src/, no more (hidden visibility works) and no fewer.
#
# Usage: bash tests/cli/test_layering.sh ZDP_BINARY [ignored arguments]
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
zdp=${1:-}
cd "$root" || exit 1

# The layers, on symbols: every object file of libzdp, the server and the
# tool, placed by its source path; a reference up the order fails, naming
# both files (tests/cli/layers.py).  Its self-test first shows that an
# upward call is caught.
if [ -z "$zdp" ]; then
  echo "test_layering: usage: test_layering.sh ZDP_BINARY (its build tree holds the object files)"
  exit 1
fi
python3 tests/cli/layers.py --self-test || exit 1
python3 tests/cli/layers.py "$(cd "$(dirname "$zdp")/.." && pwd)" || exit 1

# Headers and sources inside src/ include the public subject headers they
# need; the umbrella zdp/zdp.h is for programs using the library.
umbrella=$(grep -rl --include='*.[ch]' '#include "zdp/zdp.h"' src)
if [ -n "$umbrella" ]; then
  echo "test_layering: these files under src/ include the umbrella zdp/zdp.h; include the" \
       "subject headers they use (zdp/core.h, zdp/engine.h, ...):" $umbrella
  exit 1
fi
echo "test_layering: nothing under src/ includes the umbrella zdp/zdp.h"

# The library never exits (docs/style.md): libzdp and the server module call
# no exit, _exit, _Exit or quick_exit; a job that must stop is ended by the
# tool (zdp_server_run returns ZDP_ERR_FATAL, `zdp serve` aborts the job).
if [ -n "$zdp" ]; then
  libs=$(ls "$(dirname "$zdp")"/../libzdp*.a "$(dirname "$zdp")"/../libzdp*.so 2>/dev/null)
  if [ -z "$libs" ]; then
    echo "test_layering: no libzdp*.a or libzdp*.so beside $zdp (in $(dirname "$zdp")/..)"
    exit 1
  fi
  exits=""
  for f in $libs; do
    case $f in *.so) opt=-D ;; *) opt="" ;; esac
    found=$(nm $opt -u "$f" 2>/dev/null | awk '{print $2}' | grep -E '^(exit|_exit|_Exit|quick_exit)(@|$)')
    [ -n "$found" ] && exits="$exits $(basename "$f"): $(echo $found)"
  done
  if [ -n "$exits" ]; then
    echo "test_layering: the library calls exit:$exits; return an error (ZDP_ERR_FATAL when the job must stop)"
    exit 1
  fi
  echo "test_layering: no exit/_exit/_Exit/quick_exit in$(for f in $libs; do printf ' %s' "$(basename "$f")"; done)"
fi

lib=""
if [ -n "$zdp" ] && command -v ldd >/dev/null 2>&1; then
  lib=$(ldd "$zdp" 2>/dev/null | awk '/libzdp\.so/ {print $3}')
fi
if [ -z "$lib" ]; then
  echo "test_layering: $zdp links libzdp statically; exports not checked"
  exit 0
fi
exports=$(mktemp) || exit 1
nm -D --defined-only "$lib" | awk '{print $3}' | sort >"$exports" || exit 1
python3 - "$lib" "$exports" <<'PY'
import glob, re, sys
lib, exported = sys.argv[1], set(open(sys.argv[2]).read().split())
api = set()
for f in glob.glob('include/zdp/*.h') + glob.glob('src/*/*.h'):
    api.update(re.findall(r'\bZDP_API[^;(]*?\b(zdp_\w+)\s*\(', open(f).read()))
extra, missing = sorted(exported - api), sorted(api - exported)
if extra or missing:
    print('%s exports what is not declared ZDP_API: %s' % (lib, extra or 'nothing'))
    print('declared ZDP_API but not exported: %s' % (missing or 'nothing'))
    sys.exit(1)
print('test_layering: %s exports exactly the %d ZDP_API functions' % (lib, len(api)))
PY
rc=$?
rm -f "$exports"
exit $rc
