#!/usr/bin/env python3
"""Reads and writes safetensors files by hand, with the standard library only, to
show that tessera's files are the format Python tools read (test_io_safetensors).

    safetensors_check.py read FILE    check FILE holds exactly EXPECTED (exit 0) or say why (exit 1)
    safetensors_check.py write FILE   write EXPECTED as a safetensors file

The format: an 8-byte little-endian header length N, N bytes of UTF-8 JSON
({name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}),
then the little-endian data, offsets relative to the end of the header.
"""

import json
import struct
import sys

FORMATS = {"U8": "B", "I8": "b", "U16": "H", "I16": "h", "U32": "I", "I32": "i",
           "U64": "Q", "I64": "q", "F32": "f", "F64": "d"}

# The same tensors as expected_tensors() in test_safetensors.cpp.
EXPECTED = {
    "f32": ("F32", [2, 3], [i * 0.5 - 1 for i in range(6)]),
    "f64": ("F64", [4], [1.0 / (i + 1) for i in range(4)]),
    "i64": ("I64", [3], [-(2 ** 40), 0, 2 ** 62]),
    "i32": ("I32", [], [-7]),
    "u8": ("U8", [2, 2], [0, 1, 254, 255]),
    "empty": ("F32", [0, 3], []),
}
METADATA = {"note": "h\u00e9llo", "layout:f32": "[0, -]"}


def count(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError("header length %d past the end of the file (%d bytes)" % (n, len(data)))
    header = json.loads(data[8:8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    body = data[8 + n:]
    tensors = {}
    used = 0
    for name, entry in header.items():
        fmt = FORMATS[entry["dtype"]]
        begin, end = entry["data_offsets"]
        size = struct.calcsize("<" + fmt)
        elements = count(entry["shape"])
        if end - begin != elements * size:
            raise ValueError("%s: data_offsets %r do not match shape %r" % (name, entry["data_offsets"], entry["shape"]))
        values = list(struct.unpack("<%d%s" % (elements, fmt), body[begin:end]))
        tensors[name] = (entry["dtype"], entry["shape"], values)
        used += end - begin
    if used != len(body):
        raise ValueError("the tensors use %d bytes of a %d-byte data section" % (used, len(body)))
    return n, metadata, tensors


def check(path):
    n, metadata, tensors = read(path)
    problems = []
    if (8 + n) % 8 != 0:
        problems.append("the data section starts at byte %d, not a multiple of 8" % (8 + n))
    for key, value in METADATA.items():
        if metadata.get(key) != value:
            problems.append("metadata %r is %r, expected %r" % (key, metadata.get(key), value))
    for name, (dtype, shape, values) in EXPECTED.items():
        got = tensors.get(name)
        if got is None:
            problems.append("no tensor %r" % name)
            continue
        if got[0] != dtype or got[1] != shape:
            problems.append("%s is %s %r, expected %s %r" % (name, got[0], got[1], dtype, shape))
        if dtype == "F32":
            values = [struct.unpack("<f", struct.pack("<f", v))[0] for v in values]
        if got[2] != values:
            problems.append("%s holds %r, expected %r" % (name, got[2], values))
    for p in problems:
        print("safetensors_check: %s: %s" % (path, p))
    return 1 if problems else 0


def write(path):
    # Tensors in reverse order and no padding: another valid arrangement of the format.
    header = {"__metadata__": METADATA}
    body = b""
    for name, (dtype, shape, values) in reversed(list(EXPECTED.items())):
        raw = struct.pack("<%d%s" % (len(values), FORMATS[dtype]), *values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(body), len(body) + len(raw)]}
        body += raw
    text = json.dumps(header).encode("utf-8")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + body)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("read", "write"):
        print(__doc__)
        sys.exit(2)
    sys.exit(check(sys.argv[2]) if sys.argv[1] == "read" else write(sys.argv[2]))
