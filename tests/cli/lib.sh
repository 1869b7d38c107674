# lib.sh -- sourced by the command-line tests once they have set ZDP and
# MPIEXEC: a scratch directory $T removed on exit (a server started through
# serve_lib.sh stopped first), a failure count, and `zdp` runs under mpirun
# with a timeout, so a hang fails the test.
#   RUN_TIMEOUT  seconds each run may take (default 120); set before sourcing.
T=$(mktemp -d)
lib_cleanup_() {
  if declare -F stop_server >/dev/null; then stop_server; fi
  rm -rf "$T"
}
trap lib_cleanup_ EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

run() { # run NP ARGS... -> stdout+stderr in $T/out, exit code in $rc
  local np=$1; shift
  if [ -n "${SPLIT_OUT:-}" ]; then
    # stdout alone in $T/stdout as well: in one file, mpirun can splice a
    # stderr chunk into the middle of a stdout line (even of "step N | loss").
    timeout "${RUN_TIMEOUT:-120}" "$MPIEXEC" -np "$np" --oversubscribe "$ZDP" "$@" >"$T/stdout" 2>"$T/stderr"
    rc=$?
    cat "$T/stdout" "$T/stderr" >"$T/out"
  else
    timeout "${RUN_TIMEOUT:-120}" "$MPIEXEC" -np "$np" --oversubscribe "$ZDP" "$@" >"$T/out" 2>&1
    rc=$?
  fi
  if [ $rc -eq 124 ]; then fail "timed out (hang): zdp $*"; fi
}
expect_ok() { # expect_ok NP ARGS...
  run "$@"
  if [ $rc -ne 0 ]; then fail "exit $rc: zdp ${*:2}"; cat "$T/out"; fi
}
expect_error() { # expect_error NP SUBSTRING ARGS...: one error line, containing SUBSTRING
  local np=$1 sub=$2; shift 2
  run "$np" "$@"
  if [ $rc -eq 0 ]; then fail "exit 0, wanted an error: zdp $*"; return; fi
  if ! grep -aqF -- "$sub" "$T/out"; then fail "message lacks '$sub': zdp $*"; cat "$T/out"; fi
  local n
  n=$(grep -ac "zdp: error:" "$T/out")
  if [ "$n" -ne 1 ]; then fail "wanted one error line, got $n: zdp $*"; cat "$T/out"; fi
}

# "N LOSS" for each step line of the last run.
losses() { grep -E '^step [0-9]+ \|' "$T/out" | sed -E 's/^step ([0-9]+) \| loss ([^ ]+).*/\1 \2/'; }
# loss_of F N: the loss of step N in file F.
loss_of() { awk -v n="$2" '$1 == "step" && $2 == n { for (i = 1; i < NF; i++) if ($i == "loss") print $(i + 1) }' "$1"; }
# close A B TOL: relative difference of two numbers within TOL?
close() { awk -v a="$1" -v b="$2" -v tol="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a;
  if (a == "" || b == "" || d > tol * (m > 1e-30 ? m : 1e-30)) exit 1; exit 0 }'; }

# finish NAME: the verdict line and the exit status.
finish() {
  if [ $failures -ne 0 ]; then echo "$1: $failures failure(s)"; exit 1; fi
  echo "$1: all checks passed"
  exit 0
}
