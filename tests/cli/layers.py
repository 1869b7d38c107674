#!/usr/bin/env python3
"""The library's layers, checked on the symbols its object files reference.

Every object file of libzdp, of the server library and of the zdp tool is
placed in one layer below (by its source path).  A file may reference a
function or variable defined in its own layer or a lower one; a reference
upwards -- a lower layer calling a higher one, however the headers are
arranged -- is an error naming both files and the symbol.  A source file
that no layer claims is an error too: a new file is placed on purpose.
docs/architecture.md, "Layers", explains the order.

usage: layers.py BUILD_DIR    check a CMake build tree's object files
       layers.py --self-test  show that an upward reference is caught
"""
import fnmatch
import glob
import os
import subprocess
import sys
import tempfile

# Lowest first.  Layers on one line of the docs share a rank here: they may
# use each other's symbols only if their ranks say so (equal ranks may).
LAYERS = [
    (0, 'core', ['src/core/*']),
    (1, 'nn', ['src/nn/*']),
    (1, 'data', ['src/data/*']),
    (1, 'safetensors', ['src/safetensors/*']),
    (2, 'comm', ['src/comm/*']),
    (3, 'config', ['src/config/*']),
    (4, 'zero', ['src/zero/*']),
    (4, 'optim', ['src/optim/*']),
    (5, 'engine', ['src/engine/*']),
    (6, 'models', ['src/models/*']),
    (7, 'io', ['src/io/*']),
    (7, 'tokenizer', ['src/tokenizer/*']),
    (8, 'sample', ['src/sample/*']),
    # The server, lowest first: what every part of it shares (the job and
    # its typed results, the byte buffer, the clock), the engine calls of a
    # job, the queue that orders jobs and runs them, the decoders and
    # encoders that turn bodies into jobs and results into bodies, the wire
    # formats, and the server that assembles them.
    (9, 'serve/shared', ['src/serve/job.c', 'src/serve/results.c', 'src/serve/bytes.c',
                         'src/serve/util.c', 'src/serve/fwd_input.c']),
    (10, 'serve/exec', ['src/serve/exec*.c', 'src/serve/weights.c', 'src/serve/sampling.c',
                       'src/serve/signals.c']),
    (11, 'serve/queue', ['src/serve/queue.c']),
    (12, 'serve/codec', ['src/serve/parse*.c', 'src/serve/paths.c', 'src/serve/results_json.c']),
    (13, 'serve/wire', ['src/serve/http.c', 'src/serve/plain_*.c', 'src/serve/tinker/*']),
    (14, 'serve/server', ['src/serve/server.c']),
    (15, 'tools', ['tools/*']),
]

DEFINED = set('TDBRCVGS')


def layer_of(path):
    for rank, name, patterns in LAYERS:
        if any(fnmatch.fnmatch(path, p) for p in patterns):
            return rank, name
    return None


def symbols(obj):
    """(defined, undefined) global symbol names of one object file."""
    out = subprocess.run(['nm', obj], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == 'U':
            undefined.add(parts[1])
        elif len(parts) == 3 and parts[1] in DEFINED:
            defined.add(parts[2])
    return defined, undefined


def check(objects):
    """objects: {source path: object file}.  Returns the list of errors."""
    errors, placed, owner = [], {}, {}
    for src, obj in sorted(objects.items()):
        layer = layer_of(src)
        if layer is None:
            errors.append('%s is in no layer: add it to LAYERS in %s (and docs/architecture.md)'
                          % (src, os.path.basename(__file__)))
            continue
        defined, undefined = symbols(obj)
        placed[src] = (layer, undefined)
        for s in defined:
            owner[s] = src
    for src, (layer, undefined) in sorted(placed.items()):
        for s in sorted(undefined):
            dsrc = owner.get(s)
            if dsrc is None or dsrc not in placed:
                continue
            dlayer = placed[dsrc][0]
            if dlayer[0] > layer[0]:
                errors.append('%s (layer %s) calls up: %s is defined in %s (layer %s)'
                              % (src, layer[1], s, dsrc, dlayer[1]))
    return errors


def objects_of(build):
    """Maps each source path (relative to the repository, the current
    directory) to its object file."""
    found = {}
    for target in ('zdp', 'zdp_serve', 'zdp_cli'):
        base = os.path.join(build, 'CMakeFiles', target + '.dir')
        for obj in glob.glob(os.path.join(base, '**', '*.c.o'), recursive=True):
            src = os.path.relpath(obj, base)[:-2]
            if os.path.exists(src):  # not the stale object of a moved file
                found[src] = obj
    return found


def self_test():
    """A core function calling an engine function must be reported; an
    engine function calling a core one must not."""
    sources = {
        'src/core/base.c': 'int zdp_core_thing(void) { return 1; }\n',
        'src/engine/user.c': 'int zdp_core_thing(void);\n'
                             'int zdp_engine_thing(void) { return zdp_core_thing(); }\n',
        'src/core/bad.c': 'int zdp_engine_thing(void);\n'
                          'int zdp_core_bad(void) { return zdp_engine_thing(); }\n',
    }
    with tempfile.TemporaryDirectory() as d:
        objects = {}
        for src, text in sources.items():
            c = os.path.join(d, os.path.basename(src))
            with open(c, 'w') as f:
                f.write(text)
            subprocess.run(['cc', '-c', c, '-o', c + '.o'], check=True)
            objects[src] = c + '.o'
        errors = check(objects)
        want = 'src/core/bad.c (layer core) calls up: zdp_engine_thing is defined in src/engine/user.c'
        if len(errors) != 1 or not errors[0].startswith(want):
            sys.exit('layers.py self-test: expected one upward call reported, got %r' % errors)
        del objects['src/core/bad.c']
        if check(objects):
            sys.exit('layers.py self-test: a downward call was reported: %r' % check(objects))
    print('layers.py self-test: an upward call is reported, a downward one is not')


def main():
    if sys.argv[1:] == ['--self-test']:
        self_test()
        return
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    objects = objects_of(sys.argv[1])
    if not any(s.startswith('src/') for s in objects):
        sys.exit('layers.py: no object files under %s/CMakeFiles/{zdp,zdp_serve,zdp_cli}.dir'
                 % sys.argv[1])
    errors = check(objects)
    for e in errors:
        print('layers.py: ' + e)
    if errors:
        sys.exit(1)
    print('layers.py: %d object files, no call up the layers' % len(objects))


if __name__ == '__main__':
    main()
