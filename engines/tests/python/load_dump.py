"""Load a kvproof state dump with the safetensors package and print its positions and writers.

Usage: python3 load_dump.py DUMP.safetensors
Prints one line per cached tensor, then `OK <tensors> <rows>`; exits non-zero if the file does not read.
"""
import json
import sys

from safetensors import safe_open
from safetensors.numpy import load_file

KINDS = {0: "none", 1: "prefill", 2: "decode", 3: "copied"}


def main(path):
    arrays = load_file(path)
    with safe_open(path, framework="numpy") as f:
        header = json.loads(f.metadata()["kvproof"])
    meta = header["meta"]
    print(f"{meta['arch']} slot {meta['slot']} len {meta['len']} record {len(arrays['record.ids'])} ids")
    rows = 0
    for t in header["tensors"]:
        if t["rows"] == 0:
            continue
        key = f"layers.{t['layer']}.{t['name']}"
        data, pos, wr = arrays[key + ".rows"], arrays[key + ".positions"], arrays[key + ".writers"]
        assert data.shape == (t["rows"], t["width"]), (key, data.shape)
        assert pos.shape == (t["rows"],) and wr.shape == (t["rows"], 4)
        first = int(pos.argmax())
        req, kind, a, b = (int(x) for x in wr[first])
        print(f"{key} {t['kind']} rows={t['rows']} max_pos={int(pos.max())} writer[{first}]={KINDS[kind]} req={req} a={a} b={b}")
        rows += t["rows"]
    print(f"OK {len(header['tensors'])} {rows}")


if __name__ == "__main__":
    main(sys.argv[1])
