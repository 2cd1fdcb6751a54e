#!/usr/bin/env python3
"""Hot code footprint per RPC from two callgrind runs of the same side, a short and a
long one, written with --dump-instr=yes (examples/knb/callgrind-rpc.sh with
DUMP_INSTR=yes): the 64-byte code lines holding an instruction executed at least once per
two RPCs, counted on the difference of the runs so that start-up loops (the dynamic
linker's symbol lookups, EAL initialisation) drop out; by object file and by function.
Held against the L1 instruction cache (32 KiB here), it says whether one RPC's code
evicts itself (docs/benchmarks.md, "Flat transmit copy on memif by default").

usage: callgrind-footprint.py SHORT_FILE SHORT_RPCS LONG_FILE LONG_RPCS [TOP]
"""
import collections
import re
import sys


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    short, long_ = read(sys.argv[1]), read(sys.argv[3])
    rpcs = int(sys.argv[4]) - int(sys.argv[2])
    if rpcs <= 0:
        sys.exit("the long run must serve more RPCs than the short one")
    top = int(sys.argv[5]) if len(sys.argv) > 5 else 25
    lines = collections.defaultdict(set)
    by_fn = collections.defaultdict(set)
    for key, (n, fname) in long_.items():
        if (n - short.get(key, (0, None))[0]) * 2 >= rpcs:
            o, a = key
            lines[o].add(a >> 6)
            by_fn[fname].add((o, a >> 6))
    total = sum(len(v) for v in lines.values())
    print(f"hot 64-byte code lines per RPC: {total} ({total * 64 / 1024:.1f} KiB)")
    for o, v in sorted(lines.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(v):5}  {o}")
    print(f"by function (top {top}):")
    for fname, v in sorted(by_fn.items(), key=lambda kv: -len(kv[1]))[:top]:
        print(f"  {len(v):5}  {fname[:130]}")


def read(path):
    """(object, address) -> (instructions executed there, function)."""
    names = {}

    def name(kind, s):
        # Compressed names: "(id) name" defines, "(id)" refers back.
        m = re.match(r"\((\d+)\)(?: (.*))?", s)
        if not m:
            return s
        key = (kind, m.group(1))
        if m.group(2) is not None:
            names[key] = m.group(2)
        return names.get(key, s)

    ob = fn = None
    last, skip = 0, False
    count = collections.defaultdict(int)  # (object, address) -> instructions executed
    func = {}
    with open(path, errors="replace") as f:
        if "positions: instr" not in f.read(4096):
            sys.exit(f"{path}: no instruction positions (record with --dump-instr=yes)")
        f.seek(0)
        for line in f:
            if line.startswith("ob="):
                ob = name("ob", line[3:].strip())
            elif line.startswith("fn="):
                fn = name("fn", line[3:].strip())
            elif line.startswith("cob="):
                name("ob", line[4:].strip())
            elif line.startswith("cfn="):
                name("fn", line[4:].strip())
            elif line.startswith("calls="):
                skip = True  # the next cost line is the call's inclusive cost
            elif line[:1] in ("+", "-", "*") or line[:2] == "0x":
                parts = line.split()
                a = parts[0]
                if a.startswith("0x"):
                    addr = int(a, 16)
                elif a.startswith("+"):
                    addr = last + int(a[1:])
                elif a.startswith("-"):
                    addr = last - int(a[1:])
                else:
                    addr = last
                last = addr
                if skip:
                    skip = False
                    continue
                if len(parts) > 2:
                    count[(ob, addr)] += int(parts[2])
                    func[(ob, addr)] = fn
    return {k: (n, func[k]) for k, n in count.items()}


if __name__ == "__main__":
    main()
