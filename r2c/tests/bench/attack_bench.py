#!/usr/bin/python3
"""Protocol-attack benchmark (r2c/tests/attack_bench.sh, `make attack-proto`): a
well-behaved client's latency during each HTTP/2 or memcached attack against its
unattacked value (issue 10: goal p99 within 2x of the baseline).

Runs in the tap topology's kernel namespace with Debian's python3 (h2, hyperframe, hpack,
pymemcache). A good client does checked requests back to back on one connection through
every phase (HTTP/2: GET / and POST /echo alternately, status and body checked;
memcached: pymemcache set + get of the same key, value checked). Per phase, an attacker
process repeats one attack of r2c/tests/h2/attacks.py or r2c/tests/memcached/attack.py
(imported, not copied), each time on a new connection, until the phase time or its count
bound; its CPU time is measured (wait4) and it can run at normal priority, `nice` 19 or
SCHED_IDLE (`idle`: models an attacker on another host, which does not take CPU from the
server; `normal` is the honest number on this shared machine, always reported when asked).
The server's live counters (`--stats-file`) are read at each phase's start and end; the
defence counter's increase is reported.

usage: attack_bench.py h2|memcached HOST PORT STATS_FILE OUT_JSON OUT_MD
       [--secs S] [--prios normal,idle] [--phases a,b,...] [--max-attacks N] [--pause-ms P]
       [--warmup S] [--reps K] [--pin-cpu C|none] [--server-pids P,Q] [--min-samples N]
       [--spread-max X] [--server luna|kernel] [--answer-wait S]
Phases (after a warm-up of S seconds, not measured): K repetitions (default 3) of
`baseline, attack@prio` for every attack and priority, then a last baseline
(testbed/attack/interleave.py): every attack phase has its own baselines on both sides,
measured with the same processes and pinning. An attack phase ends after S seconds or MAX
attacks. Per attack phase the p99 against the mean of its two neighbouring baselines; per
attack@prio the median over the K repetitions, its range, and a verdict ("within 2x",
"not within 2x", "inconclusive (...)"; the rules are interleave.py's). --pin-cpu (default
1) puts this process (the good client) and every attacker on that CPU, off luna's I/O
core (CPU 0, EAL lcore 0); the server's threads' affinity is reported. CPU seconds per
phase: the attacker (wait4), this process (the good client), the server (--server-pids,
/proc). The kernel side's TCP retransmissions and RTO expiries per phase (this
namespace's counters: good client and attacker; for the kernel control also the
server's, from /proc/PID/net), the machine's input-backlog drops (/proc/net/softnet_stat)
and luna's I/O core progress (poll iterations, frames received, retransmissions; from the
same stats file) tell whether a tail was a loss or a stall. Exit status 0 when the good client saw no error in any phase
and every attack phase raised its defence counter with no attacker failure; 1 otherwise.
Timings are reported and judged in the summary, never in the exit status.

`--server kernel` (ATTACK_PROTO_SERVER=kernel in attack_bench.sh): the control, the same
phases against a kernel-TCP server (Debian's nghttpd for HTTP/2, memcached for memcached).
Those servers do not promise luna's answers nor count them, so an attacker reply that
differs and a missing defence counter are reported (the attacker's "saw" column: GOAWAY
codes, RST_STREAMs and closes; for memcached, how many runs got luna's answer and the
first difference, plus memcached's own `stats` deltas), never failures; only the good
client's errors fail a phase. STATS_FILE is then `none` (nghttpd has no counters) or
`memcached-stats` (the `stats` command on HOST:PORT, read at each phase's ends).
`--answer-wait S`: the attacker reads the answer to each attack for at most S seconds
(HTTP/2; memcached: its socket timeout) before it closes and repeats, so an attack the
server neither answers nor closes (nghttpd's PING flood, memcached's unbounded multiget)
is still repeated; without it (luna's default) an HTTP/2 attacker reads until the server
closes or the phase ends, and the memcached one waits up to 10 s for a reply.

Also `attack_bench.py attacker h2|memcached HOST PORT ATTACK SECS MAX` (the attacker
process; prints one JSON line).
"""

import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "h2"))
sys.path.insert(0, os.path.join(HERE, "..", "memcached"))

def _load_interleave():
    """testbed/attack/interleave.py (plan and verdict), loaded by path: that directory
    also holds an attack.py, which must not shadow tests/memcached/attack.py."""
    import importlib.util

    path = os.path.join(HERE, "..", "..", "..", "testbed", "attack", "interleave.py")
    spec = importlib.util.spec_from_file_location("interleave", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


interleave = _load_interleave()

H2_ATTACKS = [
    "rapid_reset",
    "made_you_reset",
    "continuation_flood",
    "hpack_bomb",
    "ping_flood",
    "settings_flood",
    "empty_frames",
    "zero_window",
    "window_overflow",
]
MC_ATTACKS = [
    "bin_bodylen_underflow",
    "bin_huge_bodylen",
    "text_bad_bytes",
    "lf_only_lines",
    "key_over_250",
    "bin_key_over_250",
    "huge_multiget",
    "long_line",
]
# The counter (server side, from --stats-file) whose increase shows the defence acted.
DEFENCE = {
    "rapid_reset": "h2_goaway_flood",
    "made_you_reset": "h2_goaway_flood",
    "continuation_flood": "h2_goaway_header_block",
    "hpack_bomb": "h2_goaway_header_list",
    "ping_flood": "h2_goaway_flood",
    "settings_flood": "h2_goaway_flood",
    "empty_frames": "h2_goaway_flood",
    "window_overflow": "h2_goaway_window_overflow",
    "zero_window": "h2_goaway_send_timeout",
    "idle": "h2_goaway_idle_timeout",
    "bin_bodylen_underflow": "parse_bad_field",
    "bin_key_over_250": "parse_bad_field",
    "bin_bad_magic": "parse_malformed",
    "bin_huge_bodylen": "errors",
    "text_bad_bytes": "errors",
    "text_value_too_large": "swallowed",
    "lf_only_lines": "errors",
    "key_over_250": "errors",
    "huge_multiget": "parse_too_large",
    "long_line": "parse_too_large",
    "valid_then_long_line": "parse_too_large",
    "large_multiget_answered": "text",
    "slow_reader": "backpressure",
}
GOOD_BODY = b"hello from luna over HTTP/2\n"


# ---------------------------------------------------------------- attacker process
# HTTP/2 attacks answered only when one of the server's timers fires (luna-h2 runs with
# --idle-timeout 3 --send-timeout 3): the attacker waits at least --timer-wait seconds
# for the answer, even past the phase's end, so short phases still see the defence.
TIMER_ATTACKS = {"zero_window", "idle"}


def attacker(kind, host, port, attack, secs, limit, timer_wait=5.0, answer_wait=None):
    """Repeats `attack` on new connections until `secs` pass or `limit` runs; one JSON
    line: runs, frames/bytes sent (HTTP/2), GOAWAY codes, RST_STREAMs (refused ones) and
    closes seen, failures (HTTP/2: connect errors; memcached: replies other than luna's)."""
    end = time.time() + secs
    out = {"runs": 0, "frames": 0, "bytes": 0, "goaway": {}, "closed": 0, "rst": 0, "refused": 0,
           "failed": 0, "fail": ""}
    if kind == "h2":
        import attacks

        while time.time() < end - 0.05 and out["runs"] < limit:
            try:
                wait = max(end - time.time(), 0.1) if answer_wait is None else answer_wait
                if attack in TIMER_ATTACKS:
                    wait = max(wait, timer_wait)
                r = attacks.run(host, port, attack, wait=min(20.0, wait))
            except OSError as e:
                out["failed"] += 1
                out["fail"] = repr(e)
                time.sleep(0.05)
                continue
            out["runs"] += 1
            out["frames"] += r["frames"]
            out["bytes"] += r["bytes"]
            out["closed"] += r["closed"]
            out["rst"] += r["rst"]
            out["refused"] += r["refused"]
            g = str(r["goaway"])
            out["goaway"][g] = out["goaway"].get(g, 0) + 1
    else:
        import attack as mc

        mc.configure(host, port)
        if answer_wait is not None:
            mc.T = answer_wait  # every socket's timeout (attack.conn)
        fn = mc.ATTACKS[attack]
        while time.time() < end - 0.05 and out["runs"] < limit:
            try:
                fn()
            except Exception as e:  # AttackFailed: the defence did not answer as promised
                out["failed"] += 1
                if not out["fail"]:  # the first: a kernel server's differences repeat
                    out["fail"] = repr(e)[:300]
            out["runs"] += 1
    print(json.dumps(out))


# ---------------------------------------------------------------- good clients
class Good(threading.Thread):
    """Checked requests back to back on one connection; (send time, latency, ok)."""

    def __init__(self, kind, host, port, pause):
        super().__init__(daemon=True)
        self.kind, self.host, self.port, self.pause = kind, host, port, pause
        self.lock = threading.Lock()
        self.samples = []
        self.errors = []  # (time, what)
        self.reconnects = 0
        self.stop = threading.Event()

    def record(self, t, lat, ok, what=""):
        with self.lock:
            self.samples.append((t, lat, ok))
            if not ok:
                self.errors.append((t, what))

    def run(self):
        while not self.stop.is_set():
            try:
                if self.kind == "h2":
                    self.run_h2()
                else:
                    self.run_mc()
            except Exception as e:  # a lost connection: an error, then reconnect
                self.record(time.time(), 0.0, False, repr(e)[:200])
                self.reconnects += 1
                time.sleep(0.1)

    def run_h2(self):
        import h2.config
        import h2.connection
        import h2.events

        s = socket.create_connection((self.host, self.port), timeout=10)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        c.initiate_connection()
        s.sendall(c.data_to_send())
        i = 0
        try:
            while not self.stop.is_set():
                echo = i % 2 == 1
                body = (b"echo-%d-" % i) * 64 if echo else b""
                sid = c.get_next_available_stream_id()
                hdrs = [
                    (":method", "POST" if echo else "GET"),
                    (":scheme", "http"),
                    (":path", "/echo" if echo else "/"),
                    (":authority", self.host),
                ]
                t0 = time.time()
                p0 = time.perf_counter()
                c.send_headers(sid, hdrs, end_stream=not echo)
                if echo:
                    c.send_data(sid, body, end_stream=True)
                s.sendall(c.data_to_send())
                status, got, done = None, b"", False
                while not done:
                    d = s.recv(65536)
                    if not d:
                        raise EOFError("server closed the good connection")
                    for ev in c.receive_data(d):
                        if isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == sid:
                            status = dict(ev.headers).get(b":status")
                        elif isinstance(ev, h2.events.DataReceived) and ev.stream_id == sid:
                            got += ev.data
                            c.acknowledge_received_data(ev.flow_controlled_length, sid)
                        elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id == sid:
                            done = True
                        elif isinstance(ev, (h2.events.StreamReset, h2.events.ConnectionTerminated)):
                            raise EOFError("good stream reset / GOAWAY: %r" % ev)
                    out = c.data_to_send()
                    if out:
                        s.sendall(out)
                lat = time.perf_counter() - p0
                want = body if echo else GOOD_BODY
                ok = status == b"200" and got == want
                self.record(t0, lat, ok, "" if ok else "status %r, %d bytes" % (status, len(got)))
                i += 1
                if self.pause:
                    time.sleep(self.pause)
        finally:
            s.close()

    def run_mc(self):
        from pymemcache.client.base import Client

        c = Client((self.host, self.port), connect_timeout=10, timeout=10, no_delay=True)
        i = 0
        try:
            while not self.stop.is_set():
                # The keys attack.py's large_multiget_answered asks for.
                key = "legit%d" % (i % 64)
                val = (b"value-%d-" % i) * (1 + i % 50)
                t0 = time.time()
                p0 = time.perf_counter()
                ok = c.set(key, val, noreply=False) is True
                p1 = time.perf_counter()
                self.record(t0, p1 - p0, ok, "" if ok else "set not stored")
                t1 = time.time()
                got = c.get(key)
                ok = got == val
                self.record(t1, time.perf_counter() - p1, ok, "" if ok else "get %r" % (got or b"")[:40])
                i += 1
                if self.pause:
                    time.sleep(self.pause)
        finally:
            c.close()

    def window(self, a, b):
        with self.lock:
            s = [x for x in self.samples if a <= x[0] < b]
            e = [x for x in self.errors if a <= x[0] < b]
        return s, e


def pct(v, q):
    if not v:
        return None
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def read_stats(path, host=None, port=None):
    """The server's counters: luna's `--stats-file` (`OK key=value ...`), or with `path`
    `memcached-stats` memcached's `stats` over a new connection (kernel control), or
    nothing (`none`: nghttpd has no counters)."""
    if path == "none":
        return {}
    if path == "memcached-stats":
        return memcached_stats(host, port)
    try:
        line = open(path).read().strip()
    except OSError:
        return {}
    out = {}
    for kv in line.split():
        k, _, v = kv.partition("=")
        if v.isdigit():
            out[k] = int(v)
    return out


def memcached_stats(host, port):
    """memcached's `STAT name value` lines as {name: int} (numeric ones), or {} if it
    does not answer within 5 s."""
    out, buf = {}, b""
    try:
        with socket.create_connection((host, port), timeout=5) as c:
            c.sendall(b"stats\r\n")
            while not buf.endswith(b"END\r\n") and len(buf) < (1 << 20):
                d = c.recv(65536)
                if not d:
                    break
                buf += d
    except OSError:
        return {}
    for line in buf.decode("ascii", "replace").splitlines():
        f = line.split()
        if len(f) == 3 and f[0] == "STAT" and f[2].isdigit():
            out[f[1]] = int(f[2])
    return out


# memcached's `stats` that change because of an attack (the kernel control's counters):
# its connections (a phase's delta includes the one `stats` read's own), values refused
# as too large, read-buffer allocation failures, connections refused.
MEMCACHED_SHOWN = ("total_connections", "store_too_large", "read_buf_oom", "rejected_connections")


def kernel_tcp(net="/proc/net"):
    """A namespace's kernel TCP counters: RetransSegs (snmp) and TCPTimeouts (netstat);
    this process's namespace, or with `net` = /proc/PID/net that of process PID."""
    out = {}
    for path, table, keys in ((net + "/snmp", "Tcp:", ("RetransSegs",)),
                              (net + "/netstat", "TcpExt:", ("TCPTimeouts",))):
        try:
            rows = [l.split() for l in open(path) if l.startswith(table)]
        except OSError:
            continue
        if len(rows) >= 2:
            d = dict(zip(rows[0][1:], rows[1][1:]))
            for k in keys:
                if d.get(k, "").isdigit():
                    out[k] = int(d[k])
    return out


def server_netns_pid(pids):
    """The first of `pids` in another network namespace than this process (the kernel
    control's server, whose TCP counters are then read from /proc/PID/net), or None."""
    try:
        mine = os.readlink("/proc/self/ns/net")
    except OSError:
        return None
    for pid in pids:
        try:
            if os.readlink("/proc/%d/ns/net" % pid) != mine:
                return pid
        except OSError:
            continue
    return None


def backlog_drops():
    """Packets the kernel dropped because a CPU's input backlog was full
    (netdev_max_backlog; the second column of /proc/net/softnet_stat, all CPUs,
    machine-wide): where a veth or tap burst can lose segments."""
    try:
        return sum(int(l.split()[1], 16) for l in open("/proc/net/softnet_stat"))
    except (OSError, IndexError, ValueError):
        return 0


def set_prio(prio):
    def f():
        if prio == "idle":
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        elif prio == "nice":
            os.nice(19)

    return f


def run_attacker(kind, host, port, attack, secs, limit, prio, timer_wait, answer_wait):
    """The attacker process at `prio`; (its JSON result, CPU seconds, wall seconds)."""
    t0 = time.time()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "attacker", kind, host, str(port), attack,
         str(secs), str(limit), str(timer_wait), "-" if answer_wait is None else str(answer_wait)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=set_prio(prio),
    )
    # Bounded: the attacker stops itself after `secs` (plus one attack's wait, at most
    # 20 s); killed past that.
    try:
        out, err = p.communicate(timeout=secs + 30)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    # The only child this process waits for: its CPU time is the difference.
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru.ru_utime - ru0.ru_utime) + (ru.ru_stime - ru0.ru_stime)
    wall = time.time() - t0
    try:
        res = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        res = {"runs": 0, "failed": 1, "fail": "attacker died: " + err.decode()[-300:]}
    return res, cpu, wall


def main():
    if sys.argv[1] == "attacker":
        kind, host, port, attack, secs, limit = sys.argv[2:8]
        timer_wait = float(sys.argv[8]) if len(sys.argv) > 8 else 5.0
        answer_wait = float(sys.argv[9]) if len(sys.argv) > 9 and sys.argv[9] != "-" else None
        attacker(kind, host, int(port), attack, float(secs), int(limit), timer_wait, answer_wait)
        return 0
    kind, host, port, stats, out_json, out_md = sys.argv[1:7]
    port = int(port)
    opts = {"--secs": "5", "--prios": "normal,idle", "--phases": "", "--max-attacks": "10000",
            "--pause-ms": "1", "--warmup": "2", "--reps": "3", "--pin-cpu": "1", "--server-pids": "",
            "--min-samples": str(interleave.MIN_SAMPLES), "--spread-max": str(interleave.SPREAD_MAX),
            "--timer-wait": "5", "--spin": "0", "--server": "luna", "--answer-wait": ""}
    rest = sys.argv[7:]
    while rest:
        k = rest.pop(0)
        if k not in opts or not rest:
            raise SystemExit("unknown or incomplete option %r (options: %s)" % (k, " ".join(opts)))
        opts[k] = rest.pop(0)
    secs = float(opts["--secs"])
    prios = [p for p in opts["--prios"].split(",") if p]
    for p in prios:
        if p not in ("normal", "nice", "idle"):
            raise SystemExit("priority %r: normal, nice or idle" % p)
    known = H2_ATTACKS + ["idle"] if kind == "h2" else MC_ATTACKS + [
        "bin_bad_magic", "text_value_too_large", "valid_then_long_line",
        "large_multiget_answered", "slow_reader"]
    attacks = [a for a in opts["--phases"].split(",") if a] or (H2_ATTACKS if kind == "h2" else MC_ATTACKS)
    for a in attacks:
        if a not in known:
            raise SystemExit("unknown attack %r for %s (known: %s)" % (a, kind, " ".join(known)))
    limit = int(opts["--max-attacks"])
    reps = int(opts["--reps"])
    if reps < 1:
        raise SystemExit("--reps: at least 1")
    min_samples, spread_max = int(opts["--min-samples"]), float(opts["--spread-max"])
    server_pids = [int(x) for x in opts["--server-pids"].split(",") if x]
    sched = {"pinned_cpu": None}
    if opts["--pin-cpu"] != "none":
        cpu = int(opts["--pin-cpu"])
        if (os.cpu_count() or 1) > cpu:
            # Before any thread or child: the good client and every attacker inherit it.
            os.sched_setaffinity(0, {cpu})
            sched["pinned_cpu"] = cpu

    timer_wait = float(opts["--timer-wait"])
    if opts["--server"] not in ("luna", "kernel"):
        raise SystemExit("--server: luna or kernel")
    answer_wait = float(opts["--answer-wait"]) if opts["--answer-wait"] else None
    if opts["--spin"] not in ("0", "1"):
        raise SystemExit("--spin: 0 or 1")
    spinner = None
    if opts["--spin"] == "1":
        # Bounded: at most the whole plan's length (plus slack); killed at the end.
        n = 2 * reps * len(attacks) * len(prios) + 1
        spinner = interleave.start_spinner(sys.executable, n * (secs + 30) + 60)
        sched["spinner"] = "SCHED_IDLE busy loop on the driver's CPU"
    try:
        return run_plan(kind, host, port, stats, out_json, out_md, opts, secs, prios, attacks, limit, reps,
                        min_samples, spread_max, server_pids, sched, timer_wait, spinner, answer_wait)
    finally:
        if spinner:
            spinner.kill()
            spinner.wait()


def run_plan(kind, host, port, stats, out_json, out_md, opts, secs, prios, attacks, limit, reps,
             min_samples, spread_max, server_pids, sched, timer_wait, spinner, answer_wait):
    server = opts["--server"]
    # Wait for the server (bounded), then start the good client.
    end = time.time() + 30
    while True:
        try:
            socket.create_connection((host, port), timeout=2).close()
            break
        except OSError:
            if time.time() > end:
                raise
            time.sleep(0.2)
    good = Good(kind, host, port, float(opts["--pause-ms"]) / 1000)
    good.start()
    time.sleep(float(opts["--warmup"]))  # warm-up: connection, first requests; not measured
    sched["affinity"] = {"driver (good client)": interleave.affinity(os.getpid())}
    for pid in server_pids:
        sched["affinity"]["server %d" % pid] = interleave.affinity(pid)

    def server_cpu():
        v = [interleave.proc_cpu(p) for p in server_pids]
        return None if not v or None in v else sum(v)

    def self_cpu():
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    # Only the kernel control's server runs its TCP in a namespace of its own.
    srv_ns = server_netns_pid(server_pids) if server == "kernel" else None
    items = [(a, p) for a in attacks for p in prios]
    steps = interleave.plan(items, reps)
    results = []
    for step_kind, item, rep in steps:
        attack, prio = (None, None) if step_kind == "baseline" else item
        before = read_stats(stats, host, port)
        k0 = kernel_tcp()
        sk0 = kernel_tcp("/proc/%d/net" % srv_ns) if srv_ns else {}
        bd0 = backlog_drops()
        s0, g0 = server_cpu(), self_cpu()
        sp0 = interleave.proc_cpu(spinner.pid) if spinner else None
        t0 = time.time()
        if attack is None:
            time.sleep(secs)
            att, cpu, wall = None, 0.0, secs
        else:
            att, cpu, wall = run_attacker(kind, host, port, attack, secs, limit, prio, timer_wait, answer_wait)
        t1 = time.time()
        s1, g1 = server_cpu(), self_cpu()
        sp1 = interleave.proc_cpu(spinner.pid) if spinner else None
        time.sleep(0.3)  # the server rewrites its stats file every 250 ms
        after = read_stats(stats, host, port)
        k1 = kernel_tcp()
        sk1 = kernel_tcp("/proc/%d/net" % srv_ns) if srv_ns else {}
        bd1 = backlog_drops()
        delta = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
        samples, errs = good.window(t0, t1)
        lat = [x[1] * 1e6 for x in samples if x[2]]
        r = {
            "phase": "baseline" if attack is None else "%s@%s" % (attack, prio),
            "kind": step_kind,
            "rep": rep,
            "attack": attack,
            "prio": prio,
            "seconds": round(t1 - t0, 3),
            "good_requests": len(samples),
            "good_errors": len(errs),
            "good_error_examples": [e[1] for e in errs[:3]],
            "p50_us": pct(lat, 0.50),
            "p99_us": pct(lat, 0.99),
            "p999_us": pct(lat, 0.999),
            "max_us": max(lat) if lat else None,
            "attacker": att,
            "attacker_cpu_s": round(cpu, 3),
            "attacker_cpu_share": round(cpu / wall, 3) if wall > 0 else None,
            "server_cpu_s": None if s0 is None or s1 is None else round(s1 - s0, 3),
            "good_client_cpu_s": round(g1 - g0, 3),
            "spinner_cpu_s": None if sp0 is None or sp1 is None else round(sp1 - sp0, 3),
            # The kernel control's servers count nothing of luna's: what they did is in
            # "attacker" (HTTP/2: GOAWAY codes, RST_STREAMs, closes) and "server_delta".
            "defence_counter": DEFENCE.get(attack) if attack and server == "luna" else None,
            "defence_delta": delta.get(DEFENCE.get(attack), 0) if attack and server == "luna" else None,
            "server_delta": delta,
            "kernel_retrans": k1.get("RetransSegs", 0) - k0.get("RetransSegs", 0),
            "kernel_rtos": k1.get("TCPTimeouts", 0) - k0.get("TCPTimeouts", 0),
            # The kernel control's server side (its namespace), None for luna.
            "server_kernel_retrans": sk1.get("RetransSegs", 0) - sk0.get("RetransSegs", 0) if srv_ns else None,
            "server_kernel_rtos": sk1.get("TCPTimeouts", 0) - sk0.get("TCPTimeouts", 0) if srv_ns else None,
            "backlog_drops": bd1 - bd0,
        }
        r["failure"] = failure(r, server)
        results.append(r)
        defence = ("defence %s+%s" % (r["defence_counter"], r["defence_delta"]) if server == "luna"
                   else "saw %s" % (saw(kind, server, att, r["server_delta"]) if att else "-"))
        print("PHASE %-28s rep=%d good=%d errors=%d p50=%s p99=%s p99.9=%s attacker=%s cpu=%.2fs server=%s %s%s"
              % (r["phase"], rep, r["good_requests"], r["good_errors"], fmt(r["p50_us"]), fmt(r["p99_us"]),
                 fmt(r["p999_us"]), (att or {}).get("runs", "-"), cpu, r["server_cpu_s"], defence,
                 "" if not r["failure"] else "  FAILED: " + r["failure"]), flush=True)
    good.stop.set()
    good.join(15)

    summary = interleave.verdicts(results, lambda p: p["phase"], "p99_us", "good_requests",
                                  min_samples=min_samples, spread_max=spread_max)
    ok = not any(r["failure"] for r in results)
    doc = {"kind": kind, "server": server, "answer_wait_s": answer_wait, "phase_seconds": secs,
           "prios": prios, "reps": reps, "ok": ok,
           "scheduling": sched, "good_reconnects": good.reconnects, "phases": results,
           "summary": summary, "verdicts": interleave.counts(summary),
           "method": {"limit": interleave.LIMIT, "min_samples": min_samples, "spread_max": spread_max},
           "failures": [{"phase": r["phase"], "rep": r["rep"], "failure": r["failure"]}
                        for r in results if r["failure"]],
           "good_cpu_s": round(self_cpu(), 3)}
    with open(out_json, "w") as f:
        json.dump(doc, f, indent=1)
    with open(out_md, "w") as f:
        f.write(markdown(doc))
    print(markdown(doc))
    for fl in doc["failures"]:
        print("FAILED %s rep %d: %s" % (fl["phase"], fl["rep"], fl["failure"]))
    print("VERDICTS %s server=%s %s" % (kind, server, json.dumps(doc["verdicts"])))
    print("ATTACK-BENCH %s server=%s ok=%d phases=%d" % (kind, server, int(ok), len(results)))
    return 0 if ok else 1


def failure(r, server="luna"):
    """Behaviour (never timing) that makes a phase fail, as text, or None: the good
    client saw an error or no reply; against luna also an attack's defence counter did
    not rise or the attacker reported an unanswered / unexpected reply (the kernel
    control's servers promise neither: what they did is reported, `saw`)."""
    why = []
    if r["good_errors"]:
        why.append("good client: %d errors (%s)" % (r["good_errors"], "; ".join(r["good_error_examples"])))
    if not r["good_requests"]:
        why.append("good client: no request completed")
    if r["attack"] and server == "luna":
        a = r["attacker"] or {}
        if a.get("failed"):
            why.append("attacker: %d failed (%s)" % (a["failed"], a.get("fail", "")))
        if not (r["defence_delta"] or 0) > 0:
            why.append("defence counter %s +0" % r["defence_counter"])
    return "; ".join(why) or None


def fmt(us):
    return "-" if us is None else "%.0f" % us


def saw(kind, server, a, delta):
    """What the attacker got back over a phase's runs, as text: HTTP/2, the GOAWAY codes,
    RST_STREAMs and closes; memcached, luna's promised answers or (kernel control) how
    many runs got luna's answer, the first difference and memcached's own counters."""
    a = a or {}
    runs = a.get("runs", 0)
    if kind == "h2":
        out = "GOAWAY " + ", ".join("%s ×%d" % (c, n) for c, n in sorted(a.get("goaway", {}).items()))
        if server == "kernel" or a.get("rst"):
            out += "; RST_STREAM %d (REFUSED %d)" % (a.get("rst", 0), a.get("refused", 0))
        if server == "kernel":
            out += "; closed by the server %d of %d" % (a.get("closed", 0), runs)
        if a.get("failed"):
            out += "; %d connect errors (%s)" % (a["failed"], a.get("fail", ""))
        return out
    if server == "luna":
        return "as promised" if not a.get("failed") else "FAILED %d: %s" % (a["failed"], a.get("fail", ""))
    out = "luna's answer in %d of %d" % (runs - a.get("failed", 0), runs)
    if a.get("failed"):
        out += "; first difference: %s" % a.get("fail", "")
    shown = ["%s +%d" % (k, delta[k]) for k in MEMCACHED_SHOWN if delta.get(k)]
    return out + ("; memcached " + ", ".join(shown) if shown else "")


def intensity(doc):
    """Per attack@priority, medians over its repetitions: attacks run per second, the
    attacker's CPU share, the server's CPU seconds per second, and what the attacker saw
    in the first repetition. How hard each server was pushed, for comparing a luna run
    with its kernel control (a server that answers slowly, or not at all, is attacked less
    often in the same time)."""
    import statistics

    by = {}
    for r in doc["phases"]:
        if r["attack"]:
            by.setdefault(r["phase"], []).append(r)
    rows = ["| attack | attacks/s | attacker CPU share | server CPU s/s | attacker saw (first repetition) |",
            "|---|---:|---:|---:|---|"]
    for name, rs in by.items():
        med = statistics.median
        rate = med([(r["attacker"] or {}).get("runs", 0) / max(r["seconds"], 1e-3) for r in rs])
        share = med([r["attacker_cpu_share"] or 0 for r in rs])
        srv = [r["server_cpu_s"] / max(r["seconds"], 1e-3) for r in rs if r["server_cpu_s"] is not None]
        first = rs[0]
        what = saw(doc["kind"], doc["server"], first["attacker"], first["server_delta"])
        if doc["server"] == "luna":
            what = "`%s` +%s; %s" % (first["defence_counter"], first["defence_delta"], what)
        rows.append("| %s | %.1f | %.0f%% | %s | %s |" % (
            name, rate, 100 * share, "%.2f" % med(srv) if srv else "-", what))
    return "\n".join(rows) + "\n"


def markdown(doc):
    kernel = doc["server"] == "kernel"
    rows = [
        "Server: %s%s.\n" % (
            "kernel control (%s on kernel TCP)" % ("nghttpd" if doc["kind"] == "h2" else "memcached")
            if kernel else "luna",
            "" if doc.get("answer_wait_s") is None else ", attacker reads each answer for at most %g s"
            % doc["answer_wait_s"]),
        "Per attack (%d repetitions of %g s phases, each attack between two baselines of its own;"
        " a baseline needs >= %d samples):\n" % (doc["reps"], doc["phase_seconds"], doc["method"]["min_samples"]),
        interleave.markdown(doc["summary"]),
        "How hard each attack pushed (medians over the repetitions):\n",
        intensity(doc),
        "Every phase:\n",
        "| phase | rep | s | good reqs | errors | p50 µs | p99 µs | p99.9 µs | p99 / neighbouring baselines"
        " | attacker runs | attacker sent | CPU s: attacker (share) / good client / server"
        " | defence counter (+Δ) | attacker saw | kernel retrans / RTOs (client side%s) | backlog drops"
        " | luna core iterations / rx frames / retransmits |" % ("; server side" if kernel else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["phases"]:
        a = r["attacker"] or {}
        sent = "-"
        if r["attack"]:
            sent = ("%d frames" % a.get("frames", 0)) if doc["kind"] == "h2" else "%d attacks" % a.get("runs", 0)
        seen = saw(doc["kind"], doc["server"], a, r["server_delta"]) if r["attack"] else "-"
        ratio = "-" if r.get("p99_over_neighbours") is None else "%.2f×" % r["p99_over_neighbours"]
        d = r["server_delta"]
        core = "-" if kernel else "%d / %d / %d" % (d.get("core_iterations", 0), d.get("core_rx_frames", 0),
                                                     d.get("core_retransmits", 0))
        cpu = "%s / %.2f / %s" % (
            "%.2f (%.0f%%)" % (r["attacker_cpu_s"], 100 * (r["attacker_cpu_share"] or 0)) if r["attack"] else "-",
            r["good_client_cpu_s"], "-" if r["server_cpu_s"] is None else "%.2f" % r["server_cpu_s"])
        defence = "-"
        if r["attack"] and not kernel:
            defence = "`%s` +%d" % (r["defence_counter"], r["defence_delta"])
        elif r["attack"]:
            defence = "none counted (kernel control)"
        tcp = "%d / %d" % (r["kernel_retrans"], r["kernel_rtos"])
        if r.get("server_kernel_retrans") is not None:
            tcp += "; %d / %d" % (r["server_kernel_retrans"], r["server_kernel_rtos"])
        rows.append("| %s | %d | %.1f | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d | %s |" % (
            r["phase"], r["rep"], r["seconds"], r["good_requests"], r["good_errors"], fmt(r["p50_us"]),
            fmt(r["p99_us"]), fmt(r["p999_us"]), ratio,
            a.get("runs", "-") if r["attack"] else "-", sent, cpu, defence, seen,
            tcp, r.get("backlog_drops", 0), core))
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.exit(main())
