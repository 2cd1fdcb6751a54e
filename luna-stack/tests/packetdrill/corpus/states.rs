//! Family `state`: every TCP state × every segment kind × sequence position (and, for
//! ACK-bearing kinds, the ACK field position), answered as RFC 9293 §3.10.7.3/§3.10.7.4 and
//! RFC 5961 §3–§5 require. The oracle below walks the RFC's checks in their order.

use super::Script;
use std::fmt::Write as _;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum St {
    SynSent,
    SynRcvd,
    Est,
    FinWait1,
    FinWait2,
    Closing,
    CloseWait,
    LastAck,
    TimeWait,
}

impl St {
    pub const ALL: [St; 9] = [
        St::SynSent,
        St::SynRcvd,
        St::Est,
        St::FinWait1,
        St::FinWait2,
        St::Closing,
        St::CloseWait,
        St::LastAck,
        St::TimeWait,
    ];
    fn short(self) -> &'static str {
        match self {
            St::SynSent => "synsent",
            St::SynRcvd => "synrcvd",
            St::Est => "est",
            St::FinWait1 => "finwait1",
            St::FinWait2 => "finwait2",
            St::Closing => "closing",
            St::CloseWait => "closewait",
            St::LastAck => "lastack",
            St::TimeWait => "timewait",
        }
    }
    fn rfc_name(self) -> &'static str {
        match self {
            St::SynSent => "SYN-SENT",
            St::SynRcvd => "SYN-RECEIVED",
            St::Est => "ESTABLISHED",
            St::FinWait1 => "FIN-WAIT-1",
            St::FinWait2 => "FIN-WAIT-2",
            St::Closing => "CLOSING",
            St::CloseWait => "CLOSE-WAIT",
            St::LastAck => "LAST-ACK",
            St::TimeWait => "TIME-WAIT",
        }
    }
    fn tcpi(self) -> &'static str {
        match self {
            St::SynSent => "TCP_SYN_SENT",
            St::SynRcvd => "TCP_SYN_RECV",
            St::Est => "TCP_ESTABLISHED",
            St::FinWait1 => "TCP_FIN_WAIT1",
            St::FinWait2 => "TCP_FIN_WAIT2",
            St::Closing => "TCP_CLOSING",
            St::CloseWait => "TCP_CLOSE_WAIT",
            St::LastAck => "TCP_LAST_ACK",
            St::TimeWait => "TCP_TIME_WAIT",
        }
    }
    /// The peer's FIN has been received (RCV.NXT is past it).
    fn peer_fin(self) -> bool {
        matches!(
            self,
            St::Closing | St::CloseWait | St::LastAck | St::TimeWait
        )
    }
    /// luna's FIN is sent and not yet acknowledged.
    fn our_fin_outstanding(self) -> bool {
        matches!(self, St::FinWait1 | St::Closing | St::LastAck)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Syn,
    SynAck,
    Ack,
    Data,
    Fin,
    FinAck,
    Rst,
    RstAck,
    SynFin,
}

impl Kind {
    pub const ALL: [Kind; 9] = [
        Kind::Syn,
        Kind::SynAck,
        Kind::Ack,
        Kind::Data,
        Kind::Fin,
        Kind::FinAck,
        Kind::Rst,
        Kind::RstAck,
        Kind::SynFin,
    ];
    fn short(self) -> &'static str {
        match self {
            Kind::Syn => "syn",
            Kind::SynAck => "synack",
            Kind::Ack => "ack",
            Kind::Data => "data",
            Kind::Fin => "fin",
            Kind::FinAck => "finack",
            Kind::Rst => "rst",
            Kind::RstAck => "rstack",
            Kind::SynFin => "synfin",
        }
    }
    fn words(self) -> &'static str {
        match self {
            Kind::Syn => "a SYN",
            Kind::SynAck => "a SYN-ACK",
            Kind::Ack => "a pure ACK",
            Kind::Data => "10 octets of data (with ACK)",
            Kind::Fin => "a FIN without ACK",
            Kind::FinAck => "a FIN-ACK",
            Kind::Rst => "a RST without ACK",
            Kind::RstAck => "a RST-ACK",
            Kind::SynFin => "a SYN+FIN",
        }
    }
    fn syn(self) -> bool {
        matches!(self, Kind::Syn | Kind::SynAck | Kind::SynFin)
    }
    fn fin(self) -> bool {
        matches!(self, Kind::Fin | Kind::FinAck | Kind::SynFin)
    }
    fn rst(self) -> bool {
        matches!(self, Kind::Rst | Kind::RstAck)
    }
    fn ack(self) -> bool {
        matches!(
            self,
            Kind::SynAck | Kind::Ack | Kind::Data | Kind::FinAck | Kind::RstAck
        )
    }
    fn data_len(self) -> u32 {
        if self == Kind::Data {
            10
        } else {
            0
        }
    }
    fn flags(self) -> &'static str {
        match self {
            Kind::Syn => "S",
            Kind::SynAck => "S.",
            Kind::Ack => ".",
            Kind::Data => "P.",
            Kind::Fin => "F",
            Kind::FinAck => "F.",
            Kind::Rst => "R",
            Kind::RstAck => "R.",
            Kind::SynFin => "SF",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Pos {
    Below,
    Left,
    Inside,
    RightEdge,
    Beyond,
}

impl Pos {
    pub const ALL: [Pos; 5] = [
        Pos::Below,
        Pos::Left,
        Pos::Inside,
        Pos::RightEdge,
        Pos::Beyond,
    ];
    fn short(self) -> &'static str {
        match self {
            Pos::Below => "below",
            Pos::Left => "left",
            Pos::Inside => "inside",
            Pos::RightEdge => "redge",
            Pos::Beyond => "beyond",
        }
    }
    fn words(self) -> &'static str {
        match self {
            Pos::Below => "below the window (SEG.SEQ = RCV.NXT - 50)",
            Pos::Left => "at the left edge (SEG.SEQ = RCV.NXT)",
            Pos::Inside => "inside the window (SEG.SEQ = RCV.NXT + 100)",
            Pos::RightEdge => "at the right edge (SEG.SEQ = RCV.NXT + RCV.WND - 1)",
            Pos::Beyond => "beyond the window (SEG.SEQ = RCV.NXT + RCV.WND)",
        }
    }
}

/// The ACK field of the probe, relative to luna's send sequence space.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AckPos {
    /// SEG.ACK = SND.UNA (a duplicate; in SYN-SENT/SYN-RECEIVED that is ISS, unacceptable).
    Una,
    /// SND.UNA < SEG.ACK =< SND.NXT (acknowledges the outstanding SYN or FIN).
    New,
    /// SND.UNA - MAX.SND.WND =< SEG.ACK < SND.UNA: an old duplicate, ignored (RFC 5961 §5.2).
    Old,
    /// SEG.ACK < SND.UNA - MAX.SND.WND: too old (RFC 5961 §5.2).
    TooOld,
    /// SEG.ACK > SND.NXT: acknowledges data never sent.
    Unsent,
}

impl AckPos {
    fn short(self) -> &'static str {
        match self {
            AckPos::Una => "una",
            AckPos::New => "new",
            AckPos::Old => "old",
            AckPos::TooOld => "tooold",
            AckPos::Unsent => "unsent",
        }
    }
    fn words(self) -> &'static str {
        match self {
            AckPos::Una => "SEG.ACK = SND.UNA",
            AckPos::New => "SND.UNA < SEG.ACK = SND.NXT",
            AckPos::Old => "SND.UNA - MAX.SND.WND < SEG.ACK < SND.UNA (old duplicate)",
            AckPos::TooOld => "SEG.ACK < SND.UNA - MAX.SND.WND (too old)",
            AckPos::Unsent => "SEG.ACK > SND.NXT (unsent data)",
        }
    }
}

/// Sequence variables after a state's prologue (peer ISN 0, luna's ISS 0 relative).
#[derive(Clone, Copy, Debug)]
struct Vars {
    rcv_nxt: u32,
    snd_una: u32,
    snd_nxt: u32,
    /// RCV.NXT + RCV.WND: the prologues never read, so luna's right edge stays at
    /// 1 + 65535 (unscaled window, never retreating).
    right_edge: u32,
    /// Octets queued for reading after the prologue.
    queued: u32,
}

const PEER_DATA: u32 = 100;
const MAX_SND_WND: u32 = 65535;

fn vars(st: St) -> Vars {
    let d = PEER_DATA;
    let right_edge = 65536;
    match st {
        St::SynSent => Vars {
            rcv_nxt: 0,
            snd_una: 0,
            snd_nxt: 1,
            right_edge,
            queued: 0,
        },
        St::SynRcvd => Vars {
            rcv_nxt: 1,
            snd_una: 0,
            snd_nxt: 1,
            right_edge,
            queued: 0,
        },
        St::Est => Vars {
            rcv_nxt: 1 + d,
            snd_una: 1 + d,
            snd_nxt: 1 + d,
            right_edge,
            queued: d,
        },
        St::FinWait1 => Vars {
            rcv_nxt: 1 + d,
            snd_una: 1 + d,
            snd_nxt: 2 + d,
            right_edge,
            queued: d,
        },
        St::FinWait2 => Vars {
            rcv_nxt: 1 + d,
            snd_una: 2 + d,
            snd_nxt: 2 + d,
            right_edge,
            queued: d,
        },
        St::Closing => Vars {
            rcv_nxt: 2 + d,
            snd_una: 1 + d,
            snd_nxt: 2 + d,
            right_edge,
            queued: d,
        },
        St::CloseWait => Vars {
            rcv_nxt: 2 + d,
            snd_una: 1 + d,
            snd_nxt: 1 + d,
            right_edge,
            queued: d,
        },
        St::LastAck => Vars {
            rcv_nxt: 2 + d,
            snd_una: 1 + d,
            snd_nxt: 2 + d,
            right_edge,
            queued: d,
        },
        St::TimeWait => Vars {
            rcv_nxt: 2 + d,
            snd_una: 2 + d,
            snd_nxt: 2 + d,
            right_edge,
            queued: d,
        },
    }
}

/// Script lines that drive luna into `st`. luna sends 100 octets and the peer acknowledges
/// them while sending 100 octets of its own, so SND.UNA, RCV.NXT and the old-duplicate
/// positions are all distinct from the ISNs; nothing is read, so no window update appears.
fn prologue(st: St) -> String {
    if st == St::SynSent {
        return "0     socket(..., SOCK_STREAM, IPPROTO_TCP) = 3\n\
                +0    fcntl(3, F_SETFL, O_RDWR|O_NONBLOCK) = 0\n\
                +0    connect(3, ..., ...) = -1 EINPROGRESS (Operation now in progress)\n\
                +0    > S 0:0(0) <...>\n"
            .to_string();
    }
    let mut s = String::from(
        "0     socket(..., SOCK_STREAM, IPPROTO_TCP) = 3\n\
         +0    bind(3, ..., ...) = 0\n\
         +0    listen(3, 1) = 0\n\
         +0    fcntl(3, F_SETFL, O_RDWR|O_NONBLOCK) = 0\n\
         +0    < S 0:0(0) win 65535 <mss 1000>\n\
         +0    > S. 0:0(0) ack 1 win 65535 <mss 1460>\n",
    );
    if st == St::SynRcvd {
        return s;
    }
    s.push_str(
        "+.1   < . 1:1(0) ack 1 win 65535\n\
         +0    accept(3, ..., ...) = 4\n\
         +0    fcntl(4, F_SETFL, O_RDWR|O_NONBLOCK) = 0\n\
         +0    write(4, ..., 100) = 100\n\
         +0    > P. 1:101(100) ack 1 win 65535\n\
         +.1   < P. 1:101(100) ack 101 win 65535\n\
         +0    > . 101:101(0) ack 101 win 65435\n",
    );
    let fin1 = "+0    shutdown(4, SHUT_WR) = 0\n+0    > F. 101:101(0) ack 101 win 65435\n";
    match st {
        St::Est => {}
        St::FinWait1 => s.push_str(fin1),
        St::FinWait2 => {
            s.push_str(fin1);
            s.push_str("+.1   < . 101:101(0) ack 102 win 65535\n");
        }
        St::Closing => {
            s.push_str(fin1);
            s.push_str("+.1   < F. 101:101(0) ack 101 win 65535\n");
            s.push_str("+0    > . 102:102(0) ack 102 win 65434\n");
        }
        St::CloseWait | St::LastAck => {
            s.push_str("+.1   < F. 101:101(0) ack 101 win 65535\n");
            s.push_str("+0    > . 101:101(0) ack 102 win 65434\n");
            if st == St::LastAck {
                s.push_str("+0    shutdown(4, SHUT_WR) = 0\n");
                s.push_str("+0    > F. 101:101(0) ack 102 win 65434\n");
            }
        }
        St::TimeWait => {
            s.push_str(fin1);
            s.push_str("+.1   < . 101:101(0) ack 102 win 65535\n");
            s.push_str("+.1   < F. 101:101(0) ack 102 win 65535\n");
            s.push_str("+0    > . 102:102(0) ack 102 win 65434\n");
        }
        St::SynSent | St::SynRcvd => unreachable!(),
    }
    s.push_str(&format!(
        "+0    getsockopt(4, SOL_TCP, TCP_INFO, {{tcpi_state={}}}, [...]) = 0\n",
        st.tcpi()
    ));
    s
}

/// What luna must send back.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Reply {
    None,
    /// <SEQ=SND.NXT><ACK=RCV.NXT><CTL=ACK>
    Ack {
        seq: u32,
        ack: u32,
    },
    /// <SEQ=SEG.ACK><CTL=RST>
    Rst {
        seq: u32,
    },
    /// <SEQ=ISS><ACK=RCV.NXT><CTL=SYN,ACK>
    SynAck {
        ack: u32,
    },
}

/// Where the connection ends up.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum After {
    State(St),
    /// CLOSED with "connection reset" (SO_ERROR ECONNRESET).
    Reset,
    /// SYN-SENT refused by an acceptable RST (ECONNREFUSED).
    Refused,
    /// LAST-ACK's FIN acknowledged: CLOSED without error.
    Closed,
    /// A passive SYN-RECEIVED returned to LISTEN.
    Listen,
}

#[derive(Clone, Debug)]
struct Outcome {
    reply: Reply,
    after: After,
    /// Octets the probe delivers in order to the reader.
    delivered: u32,
    /// The probe's FIN was accepted (end of stream).
    eof: bool,
    /// The RFC sentences that decide it.
    rules: Vec<&'static str>,
}

fn seq_lt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}
fn seq_le(a: u32, b: u32) -> bool {
    a == b || seq_lt(a, b)
}

fn probe_seq(v: &Vars, pos: Pos) -> u32 {
    match pos {
        Pos::Below => v.rcv_nxt.wrapping_sub(50),
        Pos::Left => v.rcv_nxt,
        Pos::Inside => v.rcv_nxt.wrapping_add(100),
        Pos::RightEdge => v.right_edge.wrapping_sub(1),
        Pos::Beyond => v.right_edge,
    }
}

fn probe_ack(st: St, v: &Vars, a: AckPos) -> u32 {
    match a {
        AckPos::Una => v.snd_una,
        AckPos::New => v.snd_nxt,
        AckPos::Old => v.snd_una.wrapping_sub(50),
        AckPos::TooOld => v.snd_una.wrapping_sub(MAX_SND_WND + 5000),
        AckPos::Unsent => {
            let _ = st;
            v.snd_nxt.wrapping_add(1000)
        }
    }
}

const R_FIRST: &str = "RFC 9293 §3.10.7.4 first: \"If an incoming segment is not acceptable, an \
acknowledgment should be sent in reply (unless the RST bit is set, if so drop the segment and return)\"";
const R_RST_OUT: &str =
    "RFC 5961 §3.2 / RFC 9293 §3.10.7.4 second (1): \"If the RST bit is set and \
the sequence number is outside the current receive window, silently drop the segment\"";
const R_RST_EXACT: &str = "RFC 5961 §3.2 / RFC 9293 §3.10.7.4 second (2): \"If the RST bit is set and \
the sequence number exactly matches the next expected sequence number (RCV.NXT), then TCP endpoints \
MUST reset the connection\"";
const R_RST_CHALLENGE: &str =
    "RFC 5961 §3.2 / RFC 9293 §3.10.7.4 second (3): \"If the RST bit is set \
and the sequence number does not exactly match the next expected sequence value, yet is within the \
current receive window, TCP endpoints MUST send an acknowledgment (challenge ACK)\"";
const R_RST_SYNRCVD: &str = "RFC 9293 §3.10.7.4 second, SYN-RECEIVED: \"If this connection was \
initiated with a passive OPEN (i.e., came from the LISTEN state), then return this connection to \
LISTEN state and return. The user need not be informed.\"";
const R_RST_TW: &str =
    "RFC 1337 §3 (F1) as luna decides (docs/packetdrill.md, time_wait_ignores_rst): \
RST segments in TIME-WAIT are ignored, where RFC 9293 §3.10.7.4 second would close (TIME-WAIT \
assassination)";
const R_RST_CLOSED: &str =
    "RFC 9293 §3.10.7.4 second, ESTABLISHED/FIN-WAIT-1/FIN-WAIT-2/CLOSE-WAIT: \
\"any outstanding RECEIVEs and SEND should receive 'reset' responses ... Enter the CLOSED state\"";
const R_RST_CLOSING: &str =
    "RFC 9293 §3.10.7.4 second, CLOSING/LAST-ACK: \"enter the CLOSED state, \
delete the TCB\"; luna reports the reset (ECONNRESET), its documented decision";
const R_SYN_SYNRCVD: &str =
    "RFC 9293 §3.10.7.4 fourth, SYN-RECEIVED: \"If the connection was initiated \
with a passive OPEN, then return this connection to the LISTEN state and return\"";
const R_SYN_CHALLENGE: &str = "RFC 5961 §4.2 / RFC 9293 §3.10.7.4 fourth: \"If the SYN bit is set, \
irrespective of the sequence number, TCP MUST send an ACK (also referred to as challenge ACK) to the \
remote peer\" and drop the segment";
const R_SYN_TW: &str = "RFC 9293 §3.10.7.4 fourth, TIME-WAIT, with RFC 6191: without timestamps a SYN \
does not reopen (luna's documented default, time_wait_syn_no_timestamps); RFC 5961 §4.2 challenge ACK";
const R_NO_ACK: &str =
    "RFC 9293 §3.10.7.4 fifth: \"if the ACK bit is off, drop the segment and return\"";
const R_SYNRCVD_ACK_OK: &str = "RFC 9293 §3.10.7.4 fifth, SYN-RECEIVED: \"If SND.UNA < SEG.ACK =< \
SND.NXT, then enter ESTABLISHED state and continue processing\"";
const R_SYNRCVD_ACK_BAD: &str = "RFC 9293 §3.10.7.4 fifth, SYN-RECEIVED: \"If the segment \
acknowledgment is not acceptable, form a reset segment <SEQ=SEG.ACK><CTL=RST> and send it\"";
const R_ACK_UNSENT: &str = "RFC 9293 §3.10.7.4 fifth: \"If the ACK acks something not yet sent \
(SEG.ACK > SND.NXT), then send an ACK, drop the segment, and return\"";
const R_ACK_TOO_OLD: &str = "RFC 5961 §5.2: the ACK is acceptable only if SND.UNA - MAX.SND.WND =< \
SEG.ACK =< SND.NXT; \"All incoming segments whose ACK value doesn't satisfy the above condition MUST \
be discarded and an ACK sent back\"";
const R_ACK_DUP: &str =
    "RFC 9293 §3.10.7.4 fifth: \"If the ACK is a duplicate (SEG.ACK =< SND.UNA), \
it can be ignored\" (and processing continues)";
const R_ACK_OK: &str = "RFC 9293 §3.10.7.4 fifth, ESTABLISHED (FIN-WAIT-1, FIN-WAIT-2, CLOSE-WAIT \
and LAST-ACK do the same processing first): \"If SND.UNA =< SEG.ACK =< SND.NXT, then the send window \
should be updated\"; an acceptable ACK that acknowledges nothing new and carries no text or FIN needs \
no reply, and the state stays";
const R_FW1_ACKED: &str = "RFC 9293 §3.10.7.4 fifth, FIN-WAIT-1: \"if the FIN segment is now \
acknowledged, then enter FIN-WAIT-2 and continue processing\"";
const R_CLOSING_ACK: &str =
    "RFC 9293 §3.10.7.4 fifth, CLOSING: \"if the ACK acknowledges our FIN, then \
enter the TIME-WAIT state; otherwise, ignore the segment\"";
const R_LASTACK_ACK: &str =
    "RFC 9293 §3.10.7.4 fifth, LAST-ACK: \"If our FIN is now acknowledged, \
delete the TCB, enter the CLOSED state, and return\"";
const R_TW_ACK: &str =
    "RFC 9293 §3.10.7.4 fifth, TIME-WAIT: \"The only thing that can arrive in this \
state is a retransmission of the remote FIN. Acknowledge it, and restart the 2 MSL timeout\"";
const R_TEXT: &str = "RFC 9293 §3.10.7.4 seventh, ESTABLISHED/FIN-WAIT-1/FIN-WAIT-2: deliver the \
segment text, advance RCV.NXT, send <SEQ=SND.NXT><ACK=RCV.NXT><CTL=ACK>";
const R_TEXT_OOO: &str = "RFC 9293 §3.10.7.4 (segments beyond RCV.NXT are held for later \
processing) and RFC 5681 §4.2: an out-of-order segment SHOULD be acknowledged at once (duplicate ACK \
of RCV.NXT); its text is not delivered";
const R_TEXT_IGNORED: &str =
    "RFC 9293 §3.10.7.4 seventh, CLOSE-WAIT/CLOSING/LAST-ACK/TIME-WAIT: \"This \
should not occur since a FIN has been received from the remote side. Ignore the segment text\"";
const R_FIN: &str =
    "RFC 9293 §3.10.7.4 eighth: \"If the FIN bit is set, signal the user 'connection \
closing' ..., advance RCV.NXT over the FIN, and send an acknowledgment for the FIN\"";
const R_FIN_OOO: &str = "RFC 9293 §3.10.7.4 eighth applies to the FIN only once RCV.NXT reaches it (a FIN \
beyond RCV.NXT is held, ooo_fin.pkt); RFC 5681 §4.2: out-of-order segment → immediate duplicate ACK";
const R_FIN_AFTER_FIN: &str = "RFC 9293 §3.10.7.4 eighth, CLOSE-WAIT/CLOSING/LAST-ACK: \"Remain in the \
... state\"; a second FIN at RCV.NXT (past the first) has no sequence space left to advance over: it is \
acknowledged with RCV.NXT unchanged";
const R_FIN_TW: &str =
    "RFC 9293 §3.10.7.4 eighth, TIME-WAIT: \"Remain in the TIME-WAIT state. Restart \
the 2 MSL time-wait timeout\"";
const R_SS_BAD_ACK: &str =
    "RFC 9293 §3.10.7.3 first: \"If SEG.ACK =< ISS or SEG.ACK > SND.NXT, send a \
reset (unless the RST bit is set, if so drop the segment and return) <SEQ=SEG.ACK><CTL=RST>\"";
const R_SS_RST_OK: &str =
    "RFC 9293 §3.10.7.3 second: \"If the ACK was acceptable, then signal to the \
user 'error: connection reset', drop the segment, enter CLOSED state\"";
const R_SS_RST_NOACK: &str =
    "RFC 9293 §3.10.7.3 second: \"Otherwise (no ACK), drop the segment and \
return\"";
const R_SS_SYNACK: &str =
    "RFC 9293 §3.10.7.3 fourth: SYN with an acceptable ACK: \"If SND.UNA > ISS \
(our SYN has been ACKed), change the connection state to ESTABLISHED, form an ACK segment \
<SEQ=SND.NXT><ACK=RCV.NXT><CTL=ACK> and send it\"";
const R_SS_SIMOPEN: &str = "RFC 9293 §3.10.7.3 fourth: SYN without ACK: \"Otherwise, enter SYN-RECEIVED, \
form a SYN,ACK segment <SEQ=ISS><ACK=RCV.NXT><CTL=SYN,ACK> and send it\" (other controls are queued \
until ESTABLISHED)";
const R_SS_FIFTH: &str =
    "RFC 9293 §3.10.7.3 fifth: \"If neither of the SYN or RST bits is set, then \
drop the segment and return\"";

fn syn_sent_outcome(kind: Kind, ack: AckPos) -> Outcome {
    let seg_ack = probe_ack(St::SynSent, &vars(St::SynSent), ack);
    let mut rules = Vec::new();
    let ack_ok = kind.ack() && ack == AckPos::New;
    if kind.ack() && !ack_ok {
        rules.push(R_SS_BAD_ACK);
        let reply = if kind.rst() {
            Reply::None
        } else {
            Reply::Rst { seq: seg_ack }
        };
        return Outcome {
            reply,
            after: After::State(St::SynSent),
            delivered: 0,
            eof: false,
            rules,
        };
    }
    if kind.rst() {
        if ack_ok {
            rules.push(R_SS_RST_OK);
            return Outcome {
                reply: Reply::None,
                after: After::Refused,
                delivered: 0,
                eof: false,
                rules,
            };
        }
        rules.push(R_SS_RST_NOACK);
        return Outcome {
            reply: Reply::None,
            after: After::State(St::SynSent),
            delivered: 0,
            eof: false,
            rules,
        };
    }
    if kind.syn() {
        if ack_ok {
            rules.push(R_SS_SYNACK);
            return Outcome {
                reply: Reply::Ack { seq: 1, ack: 1 },
                after: After::State(St::Est),
                delivered: 0,
                eof: false,
                rules,
            };
        }
        rules.push(R_SS_SIMOPEN);
        return Outcome {
            reply: Reply::SynAck { ack: 1 },
            after: After::State(St::SynRcvd),
            delivered: 0,
            eof: false,
            rules,
        };
    }
    rules.push(R_SS_FIFTH);
    Outcome {
        reply: Reply::None,
        after: After::State(St::SynSent),
        delivered: 0,
        eof: false,
        rules,
    }
}

fn sync_outcome(st: St, kind: Kind, pos: Pos, ack: AckPos) -> Outcome {
    let v = vars(st);
    let seq = probe_seq(&v, pos);
    let seg_ack = probe_ack(st, &v, ack);
    let dlen = kind.data_len();
    let seg_len = dlen + kind.syn() as u32 + kind.fin() as u32;
    let wnd = v.right_edge.wrapping_sub(v.rcv_nxt);
    let in_wnd = |s: u32| seq_le(v.rcv_nxt, s) && seq_lt(s, v.rcv_nxt.wrapping_add(wnd));
    let acceptable = if seg_len == 0 {
        in_wnd(seq)
    } else {
        in_wnd(seq) || in_wnd(seq.wrapping_add(seg_len - 1))
    };
    let mut rules = Vec::new();
    let ack_reply = |rcv_nxt: u32, snd_nxt: u32| Reply::Ack {
        seq: snd_nxt,
        ack: rcv_nxt,
    };
    let same = |reply, rules| Outcome {
        reply,
        after: After::State(st),
        delivered: 0,
        eof: false,
        rules,
    };
    // first: sequence number
    if !acceptable {
        rules.push(R_FIRST);
        if kind.rst() {
            rules.push(R_RST_OUT);
            return same(Reply::None, rules);
        }
        return same(ack_reply(v.rcv_nxt, v.snd_nxt), rules);
    }
    // second: RST
    if kind.rst() {
        if st == St::TimeWait {
            rules.push(R_RST_TW);
            return same(Reply::None, rules);
        }
        if seq != v.rcv_nxt {
            rules.push(R_RST_CHALLENGE);
            return same(ack_reply(v.rcv_nxt, v.snd_nxt), rules);
        }
        rules.push(R_RST_EXACT);
        let after = match st {
            St::SynRcvd => {
                rules.push(R_RST_SYNRCVD);
                After::Listen
            }
            St::Closing | St::LastAck => {
                rules.push(R_RST_CLOSING);
                After::Reset
            }
            _ => {
                rules.push(R_RST_CLOSED);
                After::Reset
            }
        };
        return Outcome {
            reply: Reply::None,
            after,
            delivered: 0,
            eof: false,
            rules,
        };
    }
    // fourth: SYN
    if kind.syn() {
        if st == St::SynRcvd {
            rules.push(R_SYN_SYNRCVD);
            return Outcome {
                reply: Reply::None,
                after: After::Listen,
                delivered: 0,
                eof: false,
                rules,
            };
        }
        rules.push(if st == St::TimeWait {
            R_SYN_TW
        } else {
            R_SYN_CHALLENGE
        });
        return same(ack_reply(v.rcv_nxt, v.snd_nxt), rules);
    }
    // fifth: ACK
    if !kind.ack() {
        rules.push(R_NO_ACK);
        return same(Reply::None, rules);
    }
    let mut cur = st;
    let mut reply = Reply::None;
    if st == St::SynRcvd {
        if seq_lt(v.snd_una, seg_ack) && seq_le(seg_ack, v.snd_nxt) {
            rules.push(R_SYNRCVD_ACK_OK);
            cur = St::Est;
        } else {
            rules.push(R_SYNRCVD_ACK_BAD);
            return same(Reply::Rst { seq: seg_ack }, rules);
        }
    } else {
        if seq_lt(v.snd_nxt, seg_ack) {
            rules.push(R_ACK_UNSENT);
            return same(ack_reply(v.rcv_nxt, v.snd_nxt), rules);
        }
        if seq_lt(seg_ack, v.snd_una.wrapping_sub(MAX_SND_WND)) {
            rules.push(R_ACK_TOO_OLD);
            return same(ack_reply(v.rcv_nxt, v.snd_nxt), rules);
        }
        if seq_lt(seg_ack, v.snd_una) {
            rules.push(R_ACK_DUP);
        }
        let fin_acked = st.our_fin_outstanding() && seg_ack == v.snd_nxt;
        match st {
            St::FinWait1 if fin_acked => {
                rules.push(R_FW1_ACKED);
                cur = St::FinWait2;
            }
            St::Closing => {
                rules.push(R_CLOSING_ACK);
                if fin_acked {
                    cur = St::TimeWait;
                } else {
                    return same(Reply::None, rules);
                }
            }
            St::LastAck if fin_acked => {
                rules.push(R_LASTACK_ACK);
                return Outcome {
                    reply: Reply::None,
                    after: After::Closed,
                    delivered: 0,
                    eof: false,
                    rules,
                };
            }
            St::TimeWait => {
                rules.push(R_TW_ACK);
                reply = ack_reply(v.rcv_nxt, v.snd_nxt);
            }
            _ => {}
        }
    }
    // seventh: text
    let mut rcv_nxt = v.rcv_nxt;
    let mut delivered = 0;
    let in_order = seq == v.rcv_nxt;
    if dlen > 0 {
        match cur {
            St::Est | St::FinWait1 | St::FinWait2 => {
                if in_order {
                    rules.push(R_TEXT);
                    delivered = dlen;
                    rcv_nxt = rcv_nxt.wrapping_add(dlen);
                } else {
                    rules.push(R_TEXT_OOO);
                }
                reply = ack_reply(rcv_nxt, v.snd_nxt);
            }
            _ => rules.push(R_TEXT_IGNORED),
        }
    }
    // eighth: FIN
    let mut eof = false;
    if kind.fin() {
        if !in_order {
            rules.push(R_FIN_OOO);
            reply = ack_reply(rcv_nxt, v.snd_nxt);
        } else {
            match cur {
                St::Est => {
                    rules.push(R_FIN);
                    cur = St::CloseWait;
                    eof = true;
                    rcv_nxt = rcv_nxt.wrapping_add(1);
                }
                St::FinWait1 => {
                    rules.push(R_FIN);
                    cur = St::Closing;
                    eof = true;
                    rcv_nxt = rcv_nxt.wrapping_add(1);
                }
                St::FinWait2 => {
                    rules.push(R_FIN);
                    cur = St::TimeWait;
                    eof = true;
                    rcv_nxt = rcv_nxt.wrapping_add(1);
                }
                St::TimeWait => rules.push(R_FIN_TW),
                _ => rules.push(R_FIN_AFTER_FIN),
            }
            reply = ack_reply(rcv_nxt, v.snd_nxt);
        }
    }
    if rules.is_empty() {
        // Only an acceptable pure ACK of nothing new reaches here without a rule (every
        // other path above names the sentence that decided it).
        rules.push(R_ACK_OK);
    }
    Outcome {
        reply,
        after: After::State(cur),
        delivered,
        eof,
        rules,
    }
}

fn probe_line(kind: Kind, seq: u32, ack: u32) -> String {
    let dlen = kind.data_len();
    let mut l = format!(
        "+.05  < {} {}:{}({})",
        kind.flags(),
        seq,
        seq.wrapping_add(dlen),
        dlen
    );
    if kind.ack() {
        let _ = write!(l, " ack {ack}");
    }
    let win = if kind.rst() { 0 } else { 65535 };
    let _ = write!(l, " win {win}");
    if kind.syn() {
        l.push_str(" <mss 1000>");
    }
    l.push('\n');
    l
}

fn reply_line(r: Reply) -> Option<String> {
    match r {
        Reply::None => None,
        Reply::Ack { seq, ack } => Some(format!("+0    > . {seq}:{seq}(0) ack {ack}\n")),
        Reply::Rst { seq } => Some(format!("+0    > R {seq}:{seq}(0)\n")),
        Reply::SynAck { ack } => Some(format!("+0    > S. 0:0(0) ack {ack} <...>\n")),
    }
}

fn reply_words(r: Reply) -> String {
    match r {
        Reply::None => "no reply".into(),
        Reply::Ack { seq, ack } => format!("an ACK <SEQ={seq}><ACK={ack}>"),
        Reply::Rst { seq } => format!("a RST <SEQ={seq}>"),
        Reply::SynAck { ack } => format!("a SYN-ACK <SEQ=ISS><ACK={ack}>"),
    }
}

fn after_words(a: After) -> String {
    match a {
        After::State(s) => format!("the connection is in {}", s.rfc_name()),
        After::Reset => "the connection is reset (CLOSED, ECONNRESET)".into(),
        After::Refused => "the connection is refused (CLOSED, ECONNREFUSED)".into(),
        After::Closed => "the connection is CLOSED".into(),
        After::Listen => "the half-open connection is gone (back to LISTEN)".into(),
    }
}

/// The follow-up lines proving where the connection is.
fn follow_up(st: St, v: &Vars, o: &Outcome) -> String {
    let mut s = String::new();
    let fd = if st == St::SynSent { 3 } else { 4 };
    let ok_read = |s: &mut String, n: u32, eof: bool| {
        if n > 0 {
            let _ = writeln!(s, "+0    read({fd}, ..., 1000) = {n}");
        }
        if eof {
            let _ = writeln!(s, "+0    read({fd}, ..., 1000) = 0");
        } else {
            let _ = writeln!(
                s,
                "+0    read({fd}, ..., 1000) = -1 EAGAIN (Resource temporarily unavailable)"
            );
        }
    };
    match o.after {
        After::State(now) => {
            if st == St::SynRcvd {
                // No socket yet: complete the handshake (if still half-open) and accept.
                if now == St::SynRcvd {
                    s.push_str("+0    < . 1:1(0) ack 1 win 65535\n");
                }
                s.push_str("+0    accept(3, ..., ...) = 4\n");
                s.push_str("+0    fcntl(4, F_SETFL, O_RDWR|O_NONBLOCK) = 0\n");
                let now = if now == St::SynRcvd { St::Est } else { now };
                let _ = writeln!(
                    s,
                    "+0    getsockopt(4, SOL_TCP, TCP_INFO, {{tcpi_state={}}}, [...]) = 0",
                    now.tcpi()
                );
                ok_read(&mut s, o.delivered, o.eof);
                return s;
            }
            let _ = writeln!(
                s,
                "+0    getsockopt({fd}, SOL_TCP, TCP_INFO, {{tcpi_state={}}}, [...]) = 0",
                now.tcpi()
            );
            if st == St::SynSent {
                if now == St::Est {
                    s.push_str("+0    getsockopt(3, SOL_SOCKET, SO_ERROR, [0], [4]) = 0\n");
                }
                return s;
            }
            // Everything queued before, plus what the probe delivered; EOF once a FIN was
            // taken (in the prologue or by the probe).
            ok_read(&mut s, v.queued + o.delivered, o.eof || st.peer_fin());
        }
        After::Reset | After::Closed | After::Refused => {
            let err = match o.after {
                After::Reset => "ECONNRESET",
                After::Refused => "ECONNREFUSED",
                _ => "0",
            };
            let _ = writeln!(
                s,
                "+0    getsockopt({fd}, SOL_TCP, TCP_INFO, {{tcpi_state=TCP_CLOSE}}, [...]) = 0"
            );
            let _ = writeln!(
                s,
                "+0    getsockopt({fd}, SOL_SOCKET, SO_ERROR, [{err}], [4]) = 0"
            );
            if st != St::SynSent {
                // No TCB any more: an ACK-bearing segment is answered <SEQ=SEG.ACK><CTL=RST>
                // (RFC 9293 §3.10.7.1).
                let _ = writeln!(
                    s,
                    "+.01  < . {r}:{r}(0) ack {a} win 65535",
                    r = v.rcv_nxt,
                    a = v.snd_nxt
                );
                let _ = writeln!(s, "+0    > R {a}:{a}(0)", a = v.snd_nxt);
            }
        }
        After::Listen => {
            s.push_str(
                "+0    accept(3, ..., ...) = -1 EAGAIN (Resource temporarily unavailable)\n",
            );
            // LISTEN answers an ACK with <SEQ=SEG.ACK><CTL=RST> (RFC 9293 §3.10.7.2).
            s.push_str("+.01  < . 1:1(0) ack 1 win 65535\n");
            s.push_str("+0    > R 1:1(0)\n");
        }
    }
    s
}

fn script(st: St, kind: Kind, pos: Option<Pos>, ack: Option<AckPos>) -> Script {
    let v = vars(st);
    let default_ack = match st {
        St::SynSent | St::SynRcvd => AckPos::New,
        _ => AckPos::Una,
    };
    let a = ack.unwrap_or(default_ack);
    let o = if st == St::SynSent {
        syn_sent_outcome(kind, a)
    } else {
        sync_outcome(st, kind, pos.expect("position"), a)
    };
    let seq = match pos {
        Some(p) => probe_seq(&v, p),
        None => 0,
    };
    let seg_ack = probe_ack(st, &v, a);
    let mut name = format!("state_{}_{}", st.short(), kind.short());
    if let Some(p) = pos {
        name.push('_');
        name.push_str(p.short());
    }
    if let Some(a) = ack {
        name.push_str("_ack_");
        name.push_str(a.short());
    }
    let mut text = String::new();
    let _ = writeln!(
        text,
        "// Generated by tests/packetdrill/corpus (family `state`); do not edit, regenerate."
    );
    let mut case = format!("{}: {} ", st.rfc_name(), kind.words());
    match pos {
        Some(p) => case.push_str(p.words()),
        None => case.push_str("(SEG.SEQ = peer ISN)"),
    }
    if kind.ack() {
        let _ = write!(case, ", {}", a.words());
    }
    case.push('.');
    super::comment(&mut text, &case);
    let expected = format!(
        "Expected: {}; {}{}{}.",
        reply_words(o.reply),
        after_words(o.after),
        if o.delivered > 0 {
            format!("; {} octets delivered", o.delivered)
        } else if kind == Kind::Data {
            "; no data delivered".to_string()
        } else {
            String::new()
        },
        if o.eof { "; end of stream" } else { "" }
    );
    super::comment(&mut text, &expected);
    for r in &o.rules {
        super::comment(&mut text, r);
    }
    let _ = writeln!(
        text,
        "// Numbers: peer ISN 0, luna's ISS 0; RCV.NXT={} RCV.WND={} SND.UNA={} SND.NXT={} (relative).",
        v.rcv_nxt,
        v.right_edge.wrapping_sub(v.rcv_nxt),
        v.snd_una,
        v.snd_nxt
    );
    text.push_str(&prologue(st));
    text.push_str(&probe_line(kind, seq, seg_ack));
    if let Some(l) = reply_line(o.reply) {
        text.push_str(&l);
    }
    text.push_str(&follow_up(st, &v, &o));
    Script {
        family: "state",
        name,
        text,
    }
}

pub fn generate(out: &mut Vec<Script>) {
    for st in St::ALL {
        for kind in Kind::ALL {
            if st == St::SynSent {
                if kind.ack() {
                    for a in [AckPos::Una, AckPos::New, AckPos::Unsent] {
                        out.push(script(st, kind, None, Some(a)));
                    }
                } else {
                    out.push(script(st, kind, None, None));
                }
                continue;
            }
            for pos in Pos::ALL {
                out.push(script(st, kind, Some(pos), None));
            }
            // The ACK field where it matters: at the left edge, for the kinds the ACK check
            // (fifth) reaches. RST-ACK and SYN-ACK are decided before it.
            if matches!(kind, Kind::Ack | Kind::Data | Kind::FinAck) {
                let acks: &[AckPos] = match st {
                    St::SynRcvd => &[AckPos::Una, AckPos::Unsent],
                    s if s.our_fin_outstanding() => {
                        &[AckPos::New, AckPos::Old, AckPos::TooOld, AckPos::Unsent]
                    }
                    _ => &[AckPos::Old, AckPos::TooOld, AckPos::Unsent],
                };
                for &a in acks {
                    out.push(script(st, kind, Some(Pos::Left), Some(a)));
                }
            }
        }
    }
}
