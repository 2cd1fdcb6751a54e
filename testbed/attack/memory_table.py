#!/usr/bin/python3
"""Per-attack server figures of an attack report (docs/reliability.md).

usage: memory_table.py REPORT_JSON

REPORT_JSON is what `LUNA_ATTACK_JSON=<file> make attack` writes: attack.json's phases,
each with the luna server's `server` figures for that phase (r2c/tests/dpdk_runtime.rs,
merge_server_phases). Prints a markdown table, one row per phase name: the high-water
marks (the largest over the phase's repetitions), the repeated bytes and every drop
reason (summed over the repetitions). Baselines are one row.
"""

import json
import sys

MARKS = ["conns_hwm", "half_open_hwm", "time_wait_hwm", "ooo_bytes_hwm",
         "ooo_bytes_one_conn_hwm", "rcvq_bytes_hwm", "sndq_bytes_hwm"]
SUMS = ["cookies_sent", "challenge_acks", "dup_bytes_in"]


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    report = json.load(open(sys.argv[1]))
    rows = {}
    for p in report.get("phases", []):
        srv = p.get("server")
        if not srv:
            continue
        r = rows.setdefault(p["phase"], {"reps": 0, "marks": {}, "sums": {}, "drops": {}})
        r["reps"] += 1
        for k in MARKS:
            r["marks"][k] = max(r["marks"].get(k, 0), srv.get(k, 0))
        for k in SUMS:
            r["sums"][k] = r["sums"].get(k, 0) + srv.get(k, 0)
        for k, v in srv.items():
            if k.startswith(("drop_", "tcp_drop_")):
                r["drops"][k] = r["drops"].get(k, 0) + v
    if not rows:
        raise SystemExit("no phase has server figures (a luna run with LUNA_ATTACK_JSON?)")
    head = ["phase", "reps"] + [k.replace("_hwm", "") for k in MARKS] + SUMS + ["drops by reason"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name, r in rows.items():
        drops = ", ".join(f"{k} {v}" for k, v in sorted(r["drops"].items())) or "-"
        cells = [name, str(r["reps"])] + [str(r["marks"][k]) for k in MARKS] \
            + [str(r["sums"][k]) for k in SUMS] + [drops]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
