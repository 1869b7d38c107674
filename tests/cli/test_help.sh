#!/usr/bin/env bash
# `zdp --help` lists the commands one line each (as git does), every command
# keeps its own --help, and an unknown command is a clear error followed by
# the list (exit 2, one error line, also under mpirun).
# usage: test_help.sh ZDP_BINARY MPIEXEC
set -u
ZDP=$1
MPIEXEC=$2
source "$(dirname "$0")/lib.sh"
COMMANDS="train sample serve gen-data ckpt tokenize"

# check_list FILE WHAT: every command on a line of its own, once, and no
# command's options run together with the list.
check_list() {
  local c
  for c in $COMMANDS; do
    [ "$(grep -cE "^ +$c +[a-z]" "$1")" -eq 1 ] || { fail "$2: no single line for '$c'"; cat "$1"; }
  done
  grep -qE -- "--(hidden|n-layer|weights|port|corpus|tag)" "$1" && { fail "$2: options in the command list"; cat "$1"; }
  [ "$(wc -l <"$1")" -le 15 ] || { fail "$2: more than 15 lines"; cat "$1"; }
  grep -qF "zdp <command> --help" "$1" || fail "$2: does not say how to get a command's options"
}

for h in --help -h help; do
  timeout 30 "$ZDP" $h >"$T/out" 2>"$T/err"
  rc=$?
  [ $rc -eq 0 ] || fail "zdp $h: exit $rc"
  [ -s "$T/err" ] && { fail "zdp $h: wrote to stderr"; cat "$T/err"; }
  check_list "$T/out" "zdp $h"
done

# No command: the list on stderr, exit 2.
timeout 30 "$ZDP" >"$T/out" 2>"$T/err"
rc=$?
[ $rc -eq 2 ] || fail "zdp (no command): exit $rc, wanted 2"
check_list "$T/err" "zdp (no command)"

# An unknown command: one error line naming it, then the list; exit 2.
for np in 0 2; do
  if [ $np -eq 0 ]; then
    timeout 30 "$ZDP" trian --model gpt >"$T/out" 2>"$T/err"
  else
    timeout 60 "$MPIEXEC" -np $np --oversubscribe "$ZDP" trian --model gpt >"$T/out" 2>"$T/err"
  fi
  rc=$?
  what="zdp trian (np $np)"
  [ $rc -eq 124 ] && fail "$what: timed out (hang)"
  [ $rc -ne 0 ] || fail "$what: exit 0"
  grep -qF 'zdp: error: unknown command "trian"' "$T/err" || { fail "$what: no error naming it"; cat "$T/err"; }
  [ "$(grep -c "zdp: error:" "$T/err")" -eq 1 ] || { fail "$what: wanted one error line"; cat "$T/err"; }
  grep -v "zdp: error:" "$T/err" | grep -v '^-\|mpirun\|Primary job\|non-zero\|Process name\|Exit code\|job to be\|^ *$\|the job has' >"$T/list"
  check_list "$T/list" "$what"
done

# Each command keeps its own --help, with its options, on stdout, exit 0.
check_help() { # check_help SUBSTRING ARGS...
  local sub=$1
  shift
  timeout 30 "$ZDP" "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  [ $rc -eq 0 ] || { fail "zdp $*: exit $rc"; cat "$T/err"; }
  grep -qF -- "$sub" "$T/out" || { fail "zdp $*: lacks '$sub'"; cat "$T/out" "$T/err"; }
  grep -q "zdp: error" "$T/out" "$T/err" && fail "zdp $*: printed an error"
}
check_help "--hidden H" train --help
check_help "--hidden H" train --model mlp --help
check_help "--n-layer L" train --model gpt --help
check_help "--weights" sample --help
check_help "--port P" serve --help
check_help "--corpus arith" gen-data --help
check_help "zdp ckpt inspect DIR" ckpt --help
check_help "zdp ckpt export DIR" ckpt export --help
check_help "--tokenizer DIR" tokenize --help

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "zdp --help and unknown commands: all passed"
