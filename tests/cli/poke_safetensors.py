"""poke_safetensors.py IN OUT TENSOR INDEX VALUE

Writes a copy of the safetensors file IN to OUT with one F32 element of
TENSOR (flat INDEX) set to VALUE (nan, inf, -inf, a number), or, with TENSOR
'*', every F32 element of every tensor multiplied by VALUE.  The CLI tests
use it to build files holding NaN/Inf or overflowing weights.
"""
import array
import json
import struct
import sys

src, dst, name, idx, val = sys.argv[1:6]
b = open(src, 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
header = json.loads(b[8:8 + n])
data = bytearray(b[8 + n:])
for key, t in header.items():
    if key == '__metadata__' or t['dtype'] != 'F32' or (name != '*' and key != name):
        continue
    lo, hi = t['data_offsets']
    a = array.array('f')
    a.frombytes(bytes(data[lo:hi]))
    if name == '*':
        a = array.array('f', [x * float(val) for x in a])
    else:
        a[int(idx)] = float(val)
    data[lo:hi] = a.tobytes()
open(dst, 'wb').write(b[:8 + n] + bytes(data))
