#!/usr/bin/python3
"""Differential test of the meta commands (mg, ms, md, ma, me, mn): luna-kv vs memcached
1.6.18 (Debian), next to mc_diff.py (whose talk() and connection handling it reuses).

Usage: mc_meta_diff.py LUNA_HOST:PORT REF_HOST:PORT [case ...]
Each case runs on a fresh connection to each server with keys unique to the run. CAS
values differ between two servers, so `c<n>` flags and `cas=<n>` are normalised; so is
`me`'s `la=` (a clock tick may fall between the servers' replies).
"""
import base64, os, re, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mc_diff import talk  # noqa: E402

RUN = os.urandom(3).hex()


def K(name):
    return (RUN + name).encode()


def B(name):
    """A binary key (with a NUL and high bytes), base64-encoded."""
    return base64.b64encode(b"\x00\xff" + K(name))


def norm(b):
    b = re.sub(rb"(?<= )c\d+", b"cN", b)
    b = re.sub(rb"cas=\d+", b"cas=N", b)
    b = re.sub(rb"la=\d+", b"la=N", b)
    b = re.sub(rb"(VALUE \S+ \d+ \d+) \d+\r\n", rb"\1 CAS\r\n", b)
    return b


def cases():
    c = []
    k, b = K, B
    add = lambda name, data: c.append((name, [data]))
    # mg: every return flag on a hit, a miss, q, k/O on a miss.
    add("mg_hit_flags", b"ms " + k("g") + b" 2 F7 T100\r\nhi\r\nmg " + k("g") + b" s v f t c k O123 h l\r\nmg " + k("g") + b" h\r\n")
    add("mg_miss", b"mg " + k("gm") + b" v\r\n")
    add("mg_miss_k_O", b"mg " + k("gm") + b" k Oab v\r\n")
    add("mg_miss_q", b"mg " + k("gm") + b" q v\r\nmg " + k("gm") + b" q k\r\nmn\r\n")
    add("mg_hit_q", b"ms " + k("gq") + b" 1\r\nx\r\nmg " + k("gq") + b" q v\r\nmn\r\n")
    add("mg_no_flags_hit", b"ms " + k("gn") + b" 1\r\nx\r\nmg " + k("gn") + b"\r\n")
    add("mg_t_unlimited", b"ms " + k("gt") + b" 1\r\nx\r\nmg " + k("gt") + b" t\r\n")
    add("mg_T_touch", b"ms " + k("gT") + b" 1 T100\r\nx\r\nmg " + k("gT") + b" t T30 t\r\nmg " + k("gT") + b" t\r\n")
    add("mg_u_no_bump", b"ms " + k("gu") + b" 1\r\nx\r\nmg " + k("gu") + b" u h\r\nmg " + k("gu") + b" h\r\nmg " + k("gu") + b" h\r\n")
    add("mg_after_get_h", b"set " + k("gh") + b" 0 0 1\r\nx\r\nget " + k("gh") + b"\r\nmg " + k("gh") + b" h\r\n")
    add("mg_vivify", b"mg " + k("gv") + b" N30 s t v c f h k\r\nmg " + k("gv") + b" h t v\r\nmg " + k("gv") + b" t\r\n")
    add("mg_vivify_t_before_N", b"mg " + k("gv2") + b" t N30 t\r\n")
    add("mg_recache", b"ms " + k("gr") + b" 1 T100\r\nx\r\nmg " + k("gr") + b" R200 t\r\nmg " + k("gr") + b" R200\r\nmg " + k("gr") + b" R50\r\n")
    add("mg_recache_lower", b"ms " + k("gr2") + b" 1 T100\r\nx\r\nmg " + k("gr2") + b" R30\r\n")
    add("mg_recache_no_ttl", b"ms " + k("gr3") + b" 1\r\nx\r\nmg " + k("gr3") + b" R30\r\n")
    add("mg_base64", b"ms " + b("b") + b" 2 b\r\nhi\r\nmg " + b("b") + b" b v k\r\nmg " + b("b") + b" b q k\r\nmg " + b("bm") + b" b k\r\n")
    add("mg_base64_plain_key", b"set " + k("bp") + b" 0 0 1\r\nx\r\nmg " + base64.b64encode(k("bp")) + b" b k v\r\n")
    add("mg_flag_token_ignored", b"ms " + k("gx") + b" 1\r\nx\r\nmg " + k("gx") + b" vfoo sbar\r\n")
    add("mg_ignored_flags", b"mg " + k("gi") + b" P L Mx D1 J1 I C1 F1\r\n")
    add("mg_many_flags_ok", b"mg " + k("gf") + b" v s t c f h k l q u O1 P L N1 R1 T1 M1\r\n")
    add("mg_too_many_flags", b"mg " + k("gf") + b" a b c d e f g h i j k l m n o p q r\r\n")
    add("mg_too_many_flags_2", b"mg " + k("gf") + b" v s t c f h k l q u O1 P L N1 R1 T1 M1 I\r\nmn\r\n")
    # mg errors.
    add("mg_alone", b"mg\r\n")
    add("mg_key_251", b"mg " + b"a" * 251 + b" v\r\n")
    add("mg_key_250", b"mg " + b"a" * 244 + K("")[:6] + b" v\r\n")
    add("mg_invalid_flag", b"mg " + k("e") + b" x\r\n")
    add("mg_dup_flag", b"mg " + k("e") + b" v v\r\n")
    add("mg_bad_T", b"mg " + k("e") + b" Tx\r\n")
    add("mg_bad_T_empty", b"mg " + k("e") + b" T\r\n")
    add("mg_bad_N", b"mg " + k("e") + b" N1x\r\n")
    add("mg_bad_R", b"mg " + k("e") + b" R-\r\n")
    add("mg_bad_then_dup", b"mg " + k("e") + b" Tx v v\r\n")
    add("mg_bad_F_keeps_msg", b"mg " + k("e") + b" Tx Fz\r\n")
    add("mg_bad_F", b"mg " + k("e") + b" Fz\r\n")
    add("mg_bad_C", b"mg " + k("e") + b" Cz\r\n")
    add("mg_bad_M_len", b"mg " + k("e") + b" MSS\r\n")
    add("mg_bad_J", b"mg " + k("e") + b" Jz\r\n")
    add("mg_bad_D", b"mg " + k("e") + b" Dz\r\n")
    add("mg_E_flag", b"mg " + k("e") + b" E5\r\n")
    add("mg_high_byte_flag", b"mg " + k("e") + b" \xc3\r\n")
    add("mg_bad_base64", b"mg " + k("e") + b" b\r\n")
    add("mg_bad_base64_pad", b"mg QQ== b v\r\nmg Q=== b\r\nmg ==== b\r\n")
    add("mg_base64_junk_skipped", b"mg Q!Q== b k\r\n")
    add("mg_opaque_32", b"mg " + k("e") + b" O" + b"x" * 31 + b"\r\n")
    add("mg_opaque_33", b"mg " + k("e") + b" O" + b"x" * 32 + b"\r\n")
    add("mg_lf_only", b"mg " + k("e") + b" v\nmn\n")
    add("mg_extra_spaces", b"mg   " + k("e") + b"   v   k  \r\n")
    add("m_unknown", b"mx foo\r\nm\r\nmgg k\r\n")
    add("mn_args", b"mn foo bar\r\n")
    # ms: modes, CAS, flags, invalidation, errors.
    add("ms_basic", b"ms " + k("s") + b" 3 T0 F4294967295\r\nabc\r\nmg " + k("s") + b" v f t\r\n")
    add("ms_c_k_O", b"ms " + k("s2") + b" 1 c k O99\r\nx\r\n")
    add("ms_q", b"ms " + k("sq") + b" 1 q\r\nx\r\nms " + k("sq") + b" 1 q ME\r\ny\r\nmn\r\n")
    add("ms_add", b"ms " + k("sa") + b" 1 ME\r\nx\r\nms " + k("sa") + b" 1 ME c\r\ny\r\nmg " + k("sa") + b" v\r\n")
    add("ms_replace_missing", b"ms " + k("sr") + b" 1 MR c k O9\r\nx\r\n")
    add("ms_replace", b"ms " + k("sr2") + b" 1\r\nx\r\nms " + k("sr2") + b" 1 MR F3\r\ny\r\nmg " + k("sr2") + b" v f\r\n")
    add("ms_append_prepend", b"ms " + k("sp") + b" 2 F5 T100\r\nbb\r\nms " + k("sp") + b" 1 MA F9\r\nc\r\nms " + k("sp") + b" 1 MP\r\na\r\nmg " + k("sp") + b" v f t\r\n")
    add("ms_append_missing", b"ms " + k("spm") + b" 1 MA\r\nx\r\nms " + k("spm") + b" 1 MP\r\nx\r\n")
    add("ms_mode_S", b"ms " + k("sS") + b" 1 MS\r\nx\r\n")
    add("ms_cas_ok_bad", b"ms " + k("sc") + b" 1\r\nx\r\nmg " + k("sc") + b" c\r\n")
    add("ms_cas_missing", b"ms " + k("scm") + b" 1 C5\r\nx\r\n")
    add("ms_cas_0", b"ms " + k("sc0") + b" 1\r\nx\r\nms " + k("sc0") + b" 1 C0\r\ny\r\n")
    add("ms_cas_wrong", b"ms " + k("scw") + b" 1\r\nx\r\nms " + k("scw") + b" 1 C999999999\r\ny\r\nms " + k("scw") + b" 1 C999999999 q\r\ny\r\nmn\r\n")
    add("ms_add_cas_missing", b"ms " + k("sac") + b" 1 ME C5\r\nx\r\n")
    add("ms_append_cas_wrong", b"ms " + k("sawc") + b" 1\r\nx\r\nms " + k("sawc") + b" 1 MA C999999999\r\ny\r\n")
    add("ms_invalidate_lower_cas", b"ms " + k("si") + b" 1 T100\r\nx\r\nms " + k("si") + b" 1\r\ny\r\nms " + k("si") + b" 1 C1 I\r\nz\r\nmg " + k("si") + b" v t\r\nmg " + k("si") + b" v\r\n")
    add("ms_invalidate_no_cas", b"ms " + k("si2") + b" 1\r\nx\r\nms " + k("si2") + b" 1 I\r\ny\r\nmg " + k("si2") + b" v\r\n")
    add("ms_zero_len", b"ms " + k("sz") + b" 0\r\n\r\nmg " + k("sz") + b" v s\r\n")
    add("ms_base64_k", b"ms " + b("sb") + b" 1 b k c\r\nx\r\nme " + b("sb") + b" b\r\n")
    add("ms_alone", b"ms\r\n")
    add("ms_no_len", b"ms " + k("e") + b"\r\nmn\r\n")
    add("ms_bad_len", b"ms " + k("e") + b" x\r\nab\r\nmn\r\n")
    add("ms_neg_len", b"ms " + k("e") + b" -1\r\nab\r\nmn\r\n")
    add("ms_len_plus", b"ms " + k("e2") + b" +1\r\nx\r\nmg " + k("e2") + b" v\r\n")
    add("ms_key_251", b"ms " + b"a" * 251 + b" 1\r\nx\r\nmn\r\n")
    add("ms_invalid_flag_swallows", b"ms " + k("e") + b" 2 Z\r\nmn\r\nmn\r\n")
    add("ms_dup_flag_swallows", b"ms " + k("e") + b" 2 T1 T2\r\nab\r\nmn\r\n")
    add("ms_bad_mode", b"ms " + k("e") + b" 1 MX\r\nx\r\nmn\r\n")
    add("ms_bad_mode_len", b"ms " + k("e") + b" 1 MSS\r\nx\r\nmn\r\n")
    add("ms_bad_F", b"ms " + k("e") + b" 1 F-1\r\nx\r\nmn\r\n")
    add("ms_bad_T", b"ms " + k("e") + b" 1 Tx\r\nx\r\nmn\r\n")
    add("ms_bad_C", b"ms " + k("e") + b" 1 Cx\r\nx\r\nmn\r\n")
    add("ms_bad_mode_and_D", b"ms " + k("e") + b" 1 Mxx Dx\r\nx\r\nmn\r\n")
    add("ms_opaque_33", b"ms " + k("e") + b" 1 O" + b"x" * 32 + b"\r\nx\r\nmn\r\n")
    add("ms_opaque_33_bad_mode", b"ms " + k("e") + b" 1 O" + b"x" * 32 + b" MZ\r\nx\r\nmn\r\n")
    add("ms_bad_base64", b"ms " + k("e") + b" 1 b\r\nx\r\nmn\r\n")
    add("ms_too_many_flags", b"ms " + k("e") + b" 1 a b c d e f g h i j k l m n o p q\r\nx\r\nmn\r\n")
    add("ms_bad_data_chunk", b"ms " + k("e") + b" 1\r\nxyz\r\nmn\r\n")
    add("ms_bad_data_chunk_q", b"ms " + k("e") + b" 1 q\r\nxyz\r\nmn\r\n")
    add("ms_data_lf_only", b"ms " + k("e") + b" 1\nx\nmn\r\n")
    # The data block in two sends.
    c.append(("ms_split", [b"ms " + k("sp2") + b" 5 T0\r\nhe", b"llo\r\nmg " + k("sp2") + b" v\r\n"]))
    # md.
    add("md_basic", b"ms " + k("d") + b" 1\r\nx\r\nmd " + k("d") + b" k O5\r\nmd " + k("d") + b" k O5\r\nmg " + k("d") + b" v\r\n")
    add("md_q", b"ms " + k("dq") + b" 1\r\nx\r\nmd " + k("dq") + b" q\r\nmd " + k("dq") + b" q\r\nmn\r\n")
    add("md_cas", b"ms " + k("dc") + b" 1\r\nx\r\nmd " + k("dc") + b" C999999999\r\nmd " + k("dc") + b" C0\r\nmg " + k("dc") + b" v\r\n")
    add("md_invalidate", b"ms " + k("di") + b" 1 T100\r\nx\r\nmd " + k("di") + b" I T30\r\nmg " + k("di") + b" v t\r\nmg " + k("di") + b" v t\r\nms " + k("di") + b" 1 C1 I\r\ny\r\n")
    add("md_invalidate_no_T", b"ms " + k("di2") + b" 1 T100\r\nx\r\nmd " + k("di2") + b" I\r\nmg " + k("di2") + b" t\r\n")
    add("md_T_without_I", b"ms " + k("dt") + b" 1\r\nx\r\nmd " + k("dt") + b" T30\r\nmg " + k("dt") + b" t\r\n")
    add("md_base64", b"ms " + b("db") + b" 1 b\r\nx\r\nmd " + b("db") + b" b k\r\nmd " + b("db") + b" b k\r\n")
    add("md_alone", b"md\r\n")
    add("md_key_251", b"md " + b"a" * 251 + b"\r\n")
    add("md_invalid_flag", b"md " + k("e") + b" x\r\n")
    add("md_dup_flag", b"md " + k("e") + b" q q\r\n")
    add("md_bad_C", b"md " + k("e") + b" Cx\r\n")
    add("md_bad_base64", b"md " + k("e") + b" b\r\n")
    add("md_opaque_33", b"md " + k("e") + b" O" + b"x" * 32 + b"\r\n")
    add("md_mode_ignored", b"md " + k("e") + b" MZ\r\n")
    add("md_too_many", b"md " + k("e") + b" a b c d e f g h i j k l m n o p q r\r\n")
    # ma.
    add("ma_missing", b"ma " + k("a") + b"\r\nma " + k("a") + b" O1 k\r\n")
    add("ma_vivify", b"ma " + k("av") + b" N0 J10 v t c\r\nma " + k("av") + b" v\r\nmg " + k("av") + b" v f t\r\n")
    add("ma_vivify_ttl", b"ma " + k("av2") + b" t N100 t v\r\n")
    add("ma_decr", b"ms " + k("ad") + b" 2\r\n10\r\nma " + k("ad") + b" MD D3 v\r\nma " + k("ad") + b" M- D30 v\r\nma " + k("ad") + b" M+ D5 v\r\nma " + k("ad") + b" MI v\r\n")
    add("ma_T_t", b"ms " + k("at") + b" 1\r\n1\r\nma " + k("at") + b" t T50 t v\r\nmg " + k("at") + b" t\r\n")
    add("ma_q", b"ms " + k("aq") + b" 1\r\n1\r\nma " + k("aq") + b" q\r\nma " + k("aq") + b" q v\r\nma " + k("aqm") + b" q\r\nmn\r\nmg " + k("aq") + b" v\r\n")
    add("ma_cas", b"ms " + k("ac") + b" 1\r\n1\r\nma " + k("ac") + b" C999999999 v\r\nma " + k("ac") + b" C0 v\r\n")
    add("ma_nonnumeric", b"ms " + k("an") + b" 1\r\nx\r\nma " + k("an") + b"\r\nma " + k("an") + b" q\r\n")
    add("ma_wrap", b"ms " + k("aw") + b" 20\r\n18446744073709551615\r\nma " + k("aw") + b" v\r\n")
    add("ma_keeps_flags", b"ms " + k("af") + b" 1 F7\r\n1\r\nma " + k("af") + b"\r\nmg " + k("af") + b" f v\r\n")
    add("ma_base64", b"ma " + b("ab") + b" b N0 J5 k v\r\nme " + b("ab") + b" b\r\n")
    add("ma_alone", b"ma\r\n")
    add("ma_key_251", b"ma " + b"a" * 251 + b"\r\n")
    add("ma_bad_mode", b"ma " + k("e") + b" MX\r\n")
    add("ma_bad_D", b"ma " + k("e") + b" Dx\r\n")
    add("ma_bad_D_neg", b"ma " + k("e") + b" D-1\r\n")
    add("ma_bad_J", b"ma " + k("e") + b" Jx\r\n")
    add("ma_bad_flag", b"ma " + k("e") + b" x\r\n")
    add("ma_opaque_33_missing", b"ma " + k("e") + b" O" + b"x" * 32 + b"\r\n")
    add("ma_D_2_64", b"ma " + k("e") + b" D18446744073709551616\r\n")
    # me.
    add("me_hit", b"ms " + k("me") + b" 2 F5 T0\r\nhi\r\nme " + k("me") + b"\r\n")
    add("me_fetched", b"ms " + k("mf") + b" 2\r\nhi\r\nmg " + k("mf") + b" v\r\nme " + k("mf") + b"\r\n")
    add("me_ttl", b"ms " + k("mt") + b" 2 T100\r\nhi\r\nme " + k("mt") + b"\r\n")
    add("me_miss", b"me " + k("mm") + b"\r\n")
    add("me_alone", b"me\r\n")
    add("me_key_251", b"me " + b"a" * 251 + b"\r\n")
    add("me_bad_base64", b"me " + k("e") + b" b\r\n")
    add("me_other_flag", b"me " + k("e") + b" x y\r\n")
    add("me_sizes", b"ms " + k("m1") + b" 100\r\n" + b"x" * 100 + b"\r\nms " + k("m2") + b" 1000\r\n" + b"y" * 1000 + b"\r\nms " + k("m3") + b" 100000\r\n" + b"z" * 100000 + b"\r\nme " + k("m1") + b"\r\nme " + k("m2") + b"\r\nme " + k("m3") + b"\r\n")
    # Expiry and size limits.
    add("ms_T_neg", b"ms " + k("xn") + b" 1 T-1\r\nx\r\nmg " + k("xn") + b" v\r\n")
    add("mg_T_neg_then_miss", b"ms " + k("xt") + b" 1\r\nx\r\nmg " + k("xt") + b" T-1\r\nmg " + k("xt") + b" v\r\n")
    add("ms_too_large", b"ms " + k("big") + b" 2000000 T0\r\n" + b"z" * 2000000 + b"\r\nmg " + k("big") + b" v\r\nmn\r\n")
    add("ms_len_int_max", b"ms " + k("e") + b" 2147483646\r\nmn\r\n")
    # Pipelines as clients send them: quiet gets ended by mn.
    keys = [k("p%d" % i) for i in range(10)]
    sets = b"".join(b"ms " + x + b" 1 q T0\r\n" + str(i % 10).encode() + b"\r\n" for i, x in enumerate(keys[::2]))
    gets = b"".join(b"mg " + x + b" q v k O" + str(i).encode() + b"\r\n" for i, x in enumerate(keys))
    add("pipeline_quiet", sets + gets + b"mn\r\n")
    add("pipeline_mixed", b"ms " + k("pm") + b" 1 q\r\n5\r\nma " + k("pm") + b" q\r\nmg " + k("pm") + b" v q\r\nmd " + k("pm") + b" q\r\nmg " + k("pm") + b" v q\r\nmn\r\n")
    # Classic commands see meta-stored items and the other way round.
    add("classic_meta", b"ms " + k("cm") + b" 3 F9 T0\r\nabc\r\ngets " + k("cm") + b"\r\nset " + k("cm") + b" 3 0 1\r\nz\r\nmg " + k("cm") + b" v f\r\n")
    return c


def talk_safe(addr, chunks):
    """talk(), with a server that closes while we still send (a 2 MB value read as a
    command line) reported as the close."""
    try:
        return talk(addr, chunks)
    except (BrokenPipeError, ConnectionResetError) as e:
        return b"", type(e).__name__


def main():
    luna, ref = sys.argv[1], sys.argv[2]
    only = sys.argv[3:]
    ndiff = total = 0
    for name, chunks in cases():
        if only and name not in only:
            continue
        total += 1
        a, ac = talk_safe(luna, chunks)
        r, rc = talk_safe(ref, chunks)
        if os.environ.get("SHOW"):
            print(f"---- {name}\n  luna: {a[:400]!r}\n  ref : {r[:400]!r}")
        if norm(a) != norm(r) or ac != rc:
            ndiff += 1
            print(f"DIFF {name}\n  sent: {b''.join(chunks)[:200]!r}\n  luna: {a[:300]!r} close={ac}\n  ref : {r[:300]!r} close={rc}")
        else:
            print(f"same {name}")
    print(f"diffs: {ndiff} of {total}")


if __name__ == "__main__":
    main()
