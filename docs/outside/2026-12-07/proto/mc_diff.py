#!/usr/bin/python3
"""Differential test: luna-kv vs reference memcached 1.6 (Debian), raw text/binary.

Usage: mc_diff.py LUNA_HOST:PORT REF_HOST:PORT
Each case runs on a fresh connection to each server (keys are unique per case),
sends the bytes (optionally in pieces), reads until quiet for 0.4 s or closed,
and prints a diff when the replies differ (version/stats lines normalised).
"""
import socket, sys, time, re, struct, os

def talk(addr, chunks, wait=0.4, total=4.0):
    h, p = addr.rsplit(":", 1)
    s = socket.create_connection((h, int(p)), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for c in chunks:
        s.sendall(c)
        if len(chunks) > 1:
            time.sleep(0.002)
    out = b""; closed = False
    s.settimeout(wait)
    end = time.time() + total
    while time.time() < end:
        try:
            d = s.recv(65536)
        except socket.timeout:
            break
        except ConnectionResetError:
            closed = "RST"; break
        if not d:
            closed = "FIN"; break
        out += d
    s.close()
    return out, closed

def norm(b):
    b = re.sub(rb"VERSION [^\r\n]*", b"VERSION x", b)
    b = re.sub(rb"(VALUE \S+ \d+ \d+) \d+\r\n", rb"\1 CAS\r\n", b)
    b = re.sub(rb"STAT [^\r\n]*\r\n", b"", b)
    return b

RUN = os.urandom(3).hex()
def K(name):
    return (RUN + name).encode()

def text_cases():
    c = []
    k = K
    c.append(("key250", [b"set " + b"a"*(250-len(RUN)) + k("") + b" 0 0 1\r\nx\r\nget " + b"a"*(250-len(RUN)) + k("") + b"\r\n"]))
    c.append(("key251", [b"set " + b"b"*251 + b" 0 0 1\r\nx\r\n"]))
    c.append(("ctrl_in_key", [b"set " + k("c\x01\x7f") + b" 0 0 1\r\nx\r\nget " + k("c\x01\x7f") + b"\r\n"]))
    c.append(("tab_in_key", [b"set " + k("t\tt") + b" 0 0 1\r\nx\r\nget " + k("t\tt") + b"\r\n"]))
    c.append(("set_extra_token", [b"set " + k("e") + b" 0 0 1 foo\r\nx\r\nget " + k("e") + b"\r\n"]))
    c.append(("exptime_huge", [b"set " + k("h") + b" 0 99999999999 1\r\nx\r\nget " + k("h") + b"\r\n"]))
    c.append(("exptime_neg", [b"set " + k("n") + b" 0 -1 1\r\nx\r\nget " + k("n") + b"\r\n"]))
    c.append(("exptime_int_min", [b"set " + k("im") + b" 0 -2147483649 1\r\nx\r\n"]))
    c.append(("flags_2_32", [b"set " + k("f") + b" 4294967296 0 1\r\nx\r\n"]))
    c.append(("flags_max", [b"set " + k("fm") + b" 4294967295 0 1\r\nx\r\nget " + k("fm") + b"\r\n"]))
    c.append(("flags_neg", [b"set " + k("fn") + b" -1 0 1\r\nx\r\n"]))
    c.append(("bytes_plus", [b"set " + k("bp") + b" 0 0 +1\r\nx\r\nget " + k("bp") + b"\r\n"]))
    c.append(("bytes_lead0", [b"set " + k("b0") + b" 0 0 01\r\nx\r\nget " + k("b0") + b"\r\n"]))
    c.append(("bytes_hex", [b"set " + k("bh") + b" 0 0 0x1\r\nx\r\n"]))
    c.append(("noreply_set_get", [b"set " + k("nr") + b" 0 0 1 noreply\r\nx\r\nget " + k("nr") + b"\r\n"]))
    c.append(("noreply_bad", [b"set " + k("nb") + b" abc 0 1 noreply\r\nx\r\nversion\r\n"]))
    c.append(("noreply_incr_nonnum", [b"set " + k("ni") + b" 0 0 1\r\nx\r\nincr " + k("ni") + b" 1 noreply\r\nversion\r\n"]))
    c.append(("noreply_get", [b"get " + k("g") + b" noreply\r\n"]))
    c.append(("noreply_touch_missing", [b"touch " + k("tm") + b" 10 noreply\r\nversion\r\n"]))
    c.append(("noreply_flush", [b"flush_all noreply\r\nversion\r\n"]))
    c.append(("noreply_verbosity", [b"verbosity 1 noreply\r\nversion\r\n"]))
    c.append(("incr_wrap", [b"set " + k("iw") + b" 0 0 20\r\n18446744073709551615\r\nincr " + k("iw") + b" 1\r\nget " + k("iw") + b"\r\n"]))
    c.append(("incr_delta_2_64", [b"set " + k("id") + b" 0 0 1\r\n1\r\nincr " + k("id") + b" 18446744073709551616\r\n"]))
    c.append(("decr_shrink", [b"set " + k("ds") + b" 0 0 3\r\n100\r\ndecr " + k("ds") + b" 1\r\nget " + k("ds") + b"\r\n"]))
    c.append(("decr_below0", [b"set " + k("d0") + b" 0 0 1\r\n5\r\ndecr " + k("d0") + b" 9\r\n"]))
    c.append(("incr_leading_space", [b"set " + k("ls") + b" 0 0 3\r\n 12\r\nincr " + k("ls") + b" 1\r\n"]))
    c.append(("incr_21_digits", [b"set " + k("i21") + b" 0 0 21\r\n000000000000000000001\r\nincr " + k("i21") + b" 1\r\n"]))
    c.append(("incr_empty", [b"set " + k("ie") + b" 0 0 0\r\n\r\nincr " + k("ie") + b" 1\r\n"]))
    c.append(("incr_neg_delta", [b"incr " + k("x") + b" -1\r\n"]))
    c.append(("incr_missing", [b"incr " + k("mm") + b" 1\r\n"]))
    c.append(("incr_keeps_flags", [b"set " + k("kf") + b" 77 0 1\r\n1\r\nincr " + k("kf") + b" 1\r\ngets " + k("kf") + b"\r\n"]))
    c.append(("cas_ok_then_stale", [b"set " + k("cs") + b" 0 0 1\r\nx\r\ngets " + k("cs") + b"\r\n"]))
    c.append(("cas_missing", [b"cas " + k("cm") + b" 0 0 1 1\r\nx\r\n"]))
    c.append(("cas_bad_unique", [b"cas " + k("cb") + b" 0 0 1 -1\r\nx\r\n"]))
    c.append(("cas_noreply", [b"cas " + k("cn") + b" 0 0 1 1 noreply\r\nx\r\nversion\r\n"]))
    c.append(("touch_ok", [b"set " + k("to") + b" 0 0 1\r\nx\r\ntouch " + k("to") + b" 100\r\n"]))
    c.append(("touch_bad_exptime", [b"set " + k("tb") + b" 0 0 1\r\nx\r\ntouch " + k("tb") + b" abc\r\n"]))
    c.append(("touch_neg", [b"set " + k("tn") + b" 0 0 1\r\nx\r\ntouch " + k("tn") + b" -1\r\nget " + k("tn") + b"\r\n"]))
    c.append(("gat", [b"set " + k("ga") + b" 5 0 1\r\nx\r\ngat 100 " + k("ga") + b"\r\ngats 100 " + k("ga") + b" " + k("nope") + b"\r\n"]))
    c.append(("gat_noargs", [b"gat 100\r\n"]))
    c.append(("gat_bad_exptime", [b"gat abc " + k("ga") + b"\r\n"]))
    c.append(("gat_neg", [b"set " + k("gn") + b" 5 0 1\r\nx\r\ngat -1 " + k("gn") + b"\r\nget " + k("gn") + b"\r\n"]))
    c.append(("delete_0", [b"delete " + k("d") + b" 0\r\n"]))
    c.append(("delete_time", [b"delete " + k("d") + b" 10\r\n"]))
    c.append(("delete_noreply_0", [b"set " + k("dn") + b" 0 0 1\r\nx\r\ndelete " + k("dn") + b" 0 noreply\r\nget " + k("dn") + b"\r\n"]))
    c.append(("empty_line", [b"\r\n"]))
    c.append(("spaces_line", [b"   \r\n"]))
    c.append(("leading_space_cmd", [b"  get " + k("z") + b"\r\n"]))
    c.append(("double_space", [b"set  " + k("sp") + b"  0  0  1\r\nx\r\nget " + k("sp") + b"\r\n"]))
    c.append(("cr_only", [b"get " + k("z") + b"\rget x\r\n"]))
    c.append(("crcr_lf", [b"get " + k("z") + b"\r\r\n"]))
    c.append(("uppercase_cmd", [b"GET " + k("z") + b"\r\n"]))
    c.append(("append_missing", [b"append " + k("am") + b" 0 0 1\r\nx\r\n"]))
    c.append(("prepend_flags_ignored", [b"set " + k("pf") + b" 1 0 1\r\nb\r\nprepend " + k("pf") + b" 9 0 1\r\na\r\ngets " + k("pf") + b"\r\n"]))
    c.append(("stats_detail", [b"stats detail dump\r\n"]))
    c.append(("stats_items", [b"stats items\r\n"]))
    c.append(("stats_reset", [b"stats reset\r\n"]))
    c.append(("version_extra", [b"version foo\r\n"]))
    c.append(("verbosity_noarg", [b"verbosity\r\n"]))
    c.append(("verbosity_bad", [b"verbosity abc\r\n"]))
    c.append(("flush_bad", [b"flush_all abc\r\n"]))
    c.append(("flush_neg", [b"set " + k("fl") + b" 0 0 1\r\nx\r\nflush_all -1\r\nget " + k("fl") + b"\r\n"]))
    c.append(("quit_pipelined", [b"get " + k("q") + b"\r\nquit\r\nget " + k("q") + b"\r\n"]))
    c.append(("data_short", [b"set " + k("sh") + b" 0 0 5\r\nabc\r\nget " + k("sh") + b"\r\n"]))
    c.append(("data_long", [b"set " + k("lo") + b" 0 0 1\r\nabc\r\nget " + k("lo") + b"\r\n"]))
    c.append(("nul_in_line", [b"get " + k("n\x00ul") + b"\r\n"]))
    c.append(("mg_meta", [b"mg " + k("m") + b" v\r\n"]))
    c.append(("mn_meta", [b"mn\r\n"]))
    c.append(("high_bytes_key", [b"set " + k("\xff\xfe") + b" 0 0 1\r\nx\r\nget " + k("\xff\xfe") + b"\r\n"]))
    return c

def main():
    luna, ref = sys.argv[1], sys.argv[2]
    only = sys.argv[3:] 
    ndiff = 0
    for name, chunks in text_cases():
        if only and name not in only:
            continue
        a, ac = talk(luna, chunks)
        b, bc = talk(ref, chunks)
        if norm(a) != norm(b) or ac != bc:
            ndiff += 1
            print(f"DIFF {name}\n  sent: {b''.join(chunks)[:200]!r}\n  luna: {a[:300]!r} close={ac}\n  ref : {b[:300]!r} close={bc}")
        else:
            print(f"same {name}")
    print("diffs:", ndiff)

if __name__ == "__main__":
    main()
