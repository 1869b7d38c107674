#!/usr/bin/env bash
# test_layering.sh -- the library's layering holds (docs/architecture.md,
# "Public headers"):
#   - no include cycle between the modules under src/ (a file of module A
#     including "../B/..." makes A depend on B), and src/core includes no
#     other module: core never calls comm, zdp_dist_init hands it the rank;
#   - when the zdp binary links libzdp.so (-DBUILD_SHARED_LIBS=ON), the
#     library exports exactly the functions declared ZDP_API in include/zdp/
#     and src/, no more (hidden visibility works) and no fewer.
#
# Usage: bash tests/cli/test_layering.sh ZDP_BINARY [ignored arguments]
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
zdp=${1:-}
cd "$root" || exit 1

python3 - <<'PY' || exit 1
import glob, os, re, sys
deps = {}
for f in glob.glob('src/*/*.[ch]'):
    mod = f.split(os.sep)[1]
    for m in re.finditer(r'^#include "\.\./(\w+)/', open(f).read(), re.M):
        if m.group(1) != mod:
            deps.setdefault(mod, set()).add(m.group(1))
if deps.get('core'):
    sys.exit('src/core includes %s: core must not depend on another module' % sorted(deps['core']))
# Depth-first search for a cycle.
state = {}
def visit(m, path):
    state[m] = 1
    for d in sorted(deps.get(m, ())):
        if state.get(d) == 1:
            sys.exit('include cycle between modules: ' + ' -> '.join(path + [m, d]))
        if d not in state:
            visit(d, path + [m])
    state[m] = 2
for m in sorted(deps):
    if m not in state:
        visit(m, [])
print('test_layering: no include cycle among %d modules; core includes none' % len(deps))
PY

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
