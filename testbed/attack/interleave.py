"""Interleaved baselines and the latency verdict of the attack benchmarks
(testbed/attack/attack.py for `make attack`, r2c/tests/bench/attack_bench.py for
`make attack-proto`; method: docs/reliability.md, "Interleaved baselines and the verdict").

A run is K repetitions of `baseline, attack 1, baseline, attack 2, ..., baseline`: every
attack phase has a baseline right before and right after it, measured with the same
processes alive and the same pinning, so a slow drift of the machine (or of the harness's
own CPU use) moves an attack and its reference together. Per attack phase:

    ratio      = p99(attack) / mean(p99(baseline before), p99(baseline after))
    ratio_lo   = p99(attack) / max(...)     (the most lenient reference)
    ratio_hi   = p99(attack) / min(...)     (the strictest reference)
    spread     = max(...) / min(...)        (how much the two references disagree)

Per attack over the K repetitions: the median of each, and the range of `ratio`. Verdict
against LIMIT (2.0, issue 12 / issue 10's "within 2x"):

- "inconclusive (baseline below N samples)" when a neighbouring baseline has fewer than
  MIN_SAMPLES latency samples (its p99 would rest on fewer than MIN_SAMPLES / 100 tail
  samples). An attack phase with few samples is judged: few samples in a fixed time means
  the client was slow, which is what is measured.
- "within 2x" when median(ratio_hi) <= LIMIT: within 2x of even the lower baseline;
- "not within 2x" when median(ratio_lo) > LIMIT: past 2x of even the higher baseline;
- otherwise the two references straddle the limit: judged by median(ratio) when the
  median spread is at most SPREAD_MAX ("within 2x" / "not within 2x", marked
  "(by the mean)"), else "inconclusive (baseline spread S > SPREAD_MAX)".
`plan`, `verdicts` and `markdown` are pure functions of the phase list (no I/O, no
clock); `affinity` and `proc_cpu` read /proc for the reports.
"""

import os
import statistics

LIMIT = 2.0
MIN_SAMPLES = 1000
SPREAD_MAX = 1.5


def plan(attacks, reps):
    """[(kind, name, rep)]: K x (baseline, attack) for every attack, then one baseline."""
    if reps < 1:
        raise ValueError("reps must be at least 1")
    out = []
    for rep in range(reps):
        for a in attacks:
            out.append(("baseline", "baseline", rep))
            out.append(("attack", a, rep))
    out.append(("baseline", "baseline", reps - 1))
    return out


def affinity(pid):
    """{allowed CPU list: [thread names]} over every thread of `pid` (what pinning was in
    effect, for the report), or None."""
    out = {}
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:
        return None
    for tid in tids:
        try:
            name = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            cpus = next(l.split(":", 1)[1].strip() for l in open(f"/proc/{pid}/task/{tid}/status")
                        if l.startswith("Cpus_allowed_list"))
        except (OSError, StopIteration):
            continue
        out.setdefault(cpus, set()).add(name)
    return {cpus: sorted(names) for cpus, names in out.items()}


def proc_cpu(pid):
    """CPU seconds (user + system, all threads) of process `pid` so far, or None."""
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def runqueue_wait(pid):
    """{thread id: seconds it has spent runnable but waiting for a CPU so far} over the
    threads of `pid` (the second field of /proc/PID/task/TID/schedstat), or None."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            out[tid] = int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            continue
    return out or None


def runqueue_wait_delta(a, b):
    """The longest any one thread waited between two runqueue_wait readings (seconds)."""
    if not a or not b:
        return None
    return round(max(b[t] - a.get(t, 0.0) for t in b), 3)


SPIN_CODE = "import sys, time\nend = time.time() + float(sys.argv[1])\nwhile time.time() < end:\n    pass\n"


def start_spinner(python, secs):
    """A SCHED_IDLE busy loop on this process's CPUs for at most `secs` (it ends itself):
    the CPU it runs on never goes idle, so a client there is woken as fast in a baseline as
    when an attacker keeps that CPU busy, and it takes only CPU nobody else wants. Returns
    the Popen (kill it when done)."""
    import subprocess

    def idle():
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))

    return subprocess.Popen([python, "-c", SPIN_CODE, str(secs)], preexec_fn=idle)


def _r(x, nd=2):
    return None if x is None else round(x, nd)


def verdicts(phases, group, p99_key, n_key, limit=LIMIT, min_samples=MIN_SAMPLES,
             spread_max=SPREAD_MAX):
    """phases: the run's phases in order, each a dict with "kind" ("baseline" or
    "attack"), p99_key and n_key; group(p) names an attack phase's row (e.g. its attack
    and attacker priority). Adds "neighbour_p99_us", "p99_over_neighbours" (ratio),
    "p99_over_neighbours_lo/hi" and "neighbour_spread" to every attack phase that has a
    baseline on both sides, and returns one summary dict per group, in first-seen order."""
    rows, order = {}, []
    for i, p in enumerate(phases):
        if p.get("kind") != "attack":
            continue
        g = group(p)
        if g not in rows:
            rows[g] = []
            order.append(g)
        nb = [phases[j] for j in (i - 1, i + 1) if 0 <= j < len(phases) and phases[j].get("kind") == "baseline"]
        rec = {"index": i, "p99_us": p.get(p99_key), "n": p.get(n_key) or 0, "failure": p.get("failure"),
               "baseline_n": [b.get(n_key) or 0 for b in nb],
               "baseline_p99_us": [b.get(p99_key) for b in nb]}
        bp = [b for b in rec["baseline_p99_us"] if b]
        if len(nb) == 2 and len(bp) == 2 and rec["p99_us"]:
            mean = sum(bp) / 2
            rec["ratio"] = rec["p99_us"] / mean
            rec["ratio_lo"] = rec["p99_us"] / max(bp)
            rec["ratio_hi"] = rec["p99_us"] / min(bp)
            rec["spread"] = max(bp) / min(bp)
            p["neighbour_p99_us"] = [_r(b, 1) for b in bp]
            p["p99_over_neighbours"] = _r(rec["ratio"])
            p["p99_over_neighbours_lo"] = _r(rec["ratio_lo"])
            p["p99_over_neighbours_hi"] = _r(rec["ratio_hi"])
            p["neighbour_spread"] = _r(rec["spread"])
        rows[g].append(rec)
    out = []
    for g in order:
        recs = rows[g]
        ok = [r for r in recs if "ratio" in r]
        s = {"attack": g, "reps": len(recs), "reps_with_ratio": len(ok),
             "attack_samples_min": min((r["n"] for r in recs), default=0),
             "baseline_samples_min": min((n for r in recs for n in r["baseline_n"]), default=0),
             "ratios": [_r(r["ratio"]) for r in ok],
             # Behaviour, not timing: an attack phase the driver marked as failed (a wrong
             # reply, an unanswered attack, a defence that did not count), never hidden.
             "failures": [r["failure"] for r in recs if r["failure"]]}
        if ok:
            med = statistics.median
            s.update({"ratio_median": _r(med([r["ratio"] for r in ok])),
                      "ratio_min": _r(min(r["ratio"] for r in ok)),
                      "ratio_max": _r(max(r["ratio"] for r in ok)),
                      "ratio_lo_median": _r(med([r["ratio_lo"] for r in ok])),
                      "ratio_hi_median": _r(med([r["ratio_hi"] for r in ok])),
                      "spread_median": _r(med([r["spread"] for r in ok]))})
        s["verdict"] = verdict(s, len(recs), limit, min_samples, spread_max)
        out.append(s)
    return out


def verdict(s, reps, limit, min_samples, spread_max):
    lim = "%gx" % limit
    if s["reps_with_ratio"] < reps:
        return "inconclusive (%d of %d repetitions without a p99 or both neighbours)" % (
            reps - s["reps_with_ratio"], reps)
    if s["baseline_samples_min"] < min_samples:
        return "inconclusive (a neighbouring baseline has %d < %d samples)" % (
            s["baseline_samples_min"], min_samples)
    # Unrounded medians are not kept; the rounded ones decide (2 decimals).
    if s["ratio_hi_median"] <= limit:
        return "within " + lim
    if s["ratio_lo_median"] > limit:
        return "not within " + lim
    if s["spread_median"] > spread_max:
        return "inconclusive (baseline spread %.2f > %.2f)" % (s["spread_median"], spread_max)
    return ("within %s (by the mean)" if s["ratio_median"] <= limit else "not within %s (by the mean)") % lim


def markdown(summary, limit=LIMIT):
    rows = ["| attack | reps | p99 / neighbouring baselines: median (min-max) | vs higher / lower baseline (medians)"
            " | baseline spread (median) | samples min: attack / baseline | latency verdict | behaviour |",
            "|---|---:|---|---|---:|---|---|---|"]
    for s in summary:
        if s.get("ratio_median") is None:
            r, lohi, sp = "-", "-", "-"
        else:
            r = "%.2fx (%.2f-%.2f)" % (s["ratio_median"], s["ratio_min"], s["ratio_max"])
            lohi = "%.2fx / %.2fx" % (s["ratio_lo_median"], s["ratio_hi_median"])
            sp = "%.2f" % s["spread_median"]
        f = s.get("failures") or []
        beh = "ok" if not f else "FAILED in %d of %d: %s" % (len(f), s["reps"], f[0])
        rows.append("| %s | %d | %s | %s | %s | %d / %d | %s | %s |" % (
            s["attack"], s["reps"], r, lohi, sp, s["attack_samples_min"], s["baseline_samples_min"],
            s["verdict"], beh))
    return "\n".join(rows) + "\n"


def counts(summary):
    """{"within": n, "not within": n, "inconclusive": n}."""
    c = {"within": 0, "not within": 0, "inconclusive": 0}
    for s in summary:
        v = s["verdict"]
        c["inconclusive" if v.startswith("inconclusive") else "not within" if v.startswith("not") else "within"] += 1
    return c


if __name__ == "__main__":
    # Self-check of the verdict rules on made-up phase lists (no network):
    # `python3 testbed/attack/interleave.py`.
    def ph(kind, p99, n=2000, name="x"):
        return {"kind": kind, "name": name, "p99": p99, "n": n}

    def one(base_a, att, base_b, **kw):
        return verdicts([ph("baseline", base_a), ph("attack", att), ph("baseline", base_b)],
                        lambda p: p["name"], "p99", "n", **kw)[0]["verdict"]

    assert plan(["a", "b"], 2) == [("baseline", "baseline", 0), ("attack", "a", 0), ("baseline", "baseline", 0),
                                   ("attack", "b", 0), ("baseline", "baseline", 1), ("attack", "a", 1),
                                   ("baseline", "baseline", 1), ("attack", "b", 1), ("baseline", "baseline", 1)]
    assert one(1000, 1900, 1000) == "within 2x", one(1000, 1900, 1000)
    assert one(1000, 2100, 1000) == "not within 2x"
    assert one(1000, 5000, 2000) == "not within 2x"          # past 2x of even the higher one
    assert one(1000, 1900, 3000) == "within 2x"              # within 2x of even the lower one
    assert one(1000, 2500, 1400) == "not within 2x (by the mean)"
    assert one(1000, 2300, 1400) == "within 2x (by the mean)"
    assert one(1000, 3000, 2000).startswith("inconclusive (baseline spread 2.00")
    assert one(1000, 1500, 1000, min_samples=5000).startswith("inconclusive (a neighbouring baseline")
    # A slow attack phase (few samples) is judged, not excused.
    assert verdicts([ph("baseline", 1000), ph("attack", 9000, n=10), ph("baseline", 1000)],
                    lambda p: p["name"], "p99", "n")[0]["verdict"] == "not within 2x"
    # The median over repetitions: one outlier does not decide.
    seq = [ph("baseline", 1000), ph("attack", 1500), ph("baseline", 1000), ph("attack", 9000),
           ph("baseline", 1000), ph("attack", 1200), ph("baseline", 1000)]
    s = verdicts(seq, lambda p: p["name"], "p99", "n")[0]
    assert (s["verdict"], s["ratio_median"], s["ratio_max"]) == ("within 2x", 1.5, 9.0), s
    seq[3]["failure"] = "attacker: TimeoutError"
    s = verdicts(seq, lambda p: p["name"], "p99", "n")[0]
    assert s["failures"] == ["attacker: TimeoutError"] and "FAILED in 1 of 3" in markdown([s]), markdown([s])
    print("interleave.py: verdict rules ok")
