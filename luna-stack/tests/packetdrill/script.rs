//! The packetdrill-language subset: its syntax tree and a line parser.
//!
//! Every construct outside the subset is a [`ScriptError`] naming the line, never a panic.
//! The grammar is documented in docs/packetdrill.md.

use std::fmt;

/// A script error: where, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptError {
    /// 1-based line of the script (0: the script as a whole).
    pub line: usize,
    /// What went wrong, possibly several lines (expected vs actual packets).
    pub msg: String,
    /// The script uses something luna or the runner cannot do (a shell command, an unknown
    /// sysctl, IPv6...): the script is skipped with `msg` as the reason, never passed.
    pub skip: bool,
}

impl ScriptError {
    pub fn new(line: usize, msg: impl Into<String>) -> Self {
        ScriptError {
            line,
            msg: msg.into(),
            skip: false,
        }
    }

    /// A reason to skip the script (valid upstream syntax luna cannot run).
    pub fn skip(line: usize, msg: impl Into<String>) -> Self {
        ScriptError {
            skip: true,
            ..ScriptError::new(line, msg)
        }
    }
}

impl fmt::Display for ScriptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.skip { "skipped: " } else { "" };
        write!(f, "line {}: {what}{}", self.line, self.msg)
    }
}

pub type Result<T> = std::result::Result<T, ScriptError>;

/// When an event happens, in microseconds of script time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Time {
    /// `0.200`: since the start of the script.
    Abs(u64),
    /// `+0.1`: after the previous event.
    Rel(u64),
    /// `*`: whenever (outbound packets only).
    Any,
}

/// A parsed script.
#[derive(Debug, Clone)]
pub struct Script {
    /// `--name=value` header options, with their lines.
    pub options: Vec<(usize, String, String)>,
    pub events: Vec<Event>,
}

/// One timed statement.
#[derive(Debug, Clone)]
pub struct Event {
    pub line: usize,
    pub time: Time,
    /// `start...end` for a blocking system call: when it must return.
    pub end: Option<Time>,
    pub kind: EventKind,
}

#[derive(Debug, Clone)]
pub enum EventKind {
    Packet(PacketSpec),
    Syscall(Syscall),
    /// A backquoted shell command (possibly several lines), run by `engine::shell`.
    Shell(String),
    /// A `%{ python }%` block: never evaluated, the script is skipped (docs/packetdrill.md).
    Python(String),
    /// An ICMP packet line.
    Icmp(IcmpSpec),
}

/// `< icmp unreachable frag_needed mtu 1200 [1:1001(1000)]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IcmpSpec {
    pub dir: Direction,
    /// `unreachable`, `time_exceeded`, `source_quench`...
    pub kind: String,
    /// `frag_needed`, `port_unreachable`... (empty if none).
    pub code: String,
    pub mtu: Option<u16>,
    /// The quoted TCP segment `[start:end(len)]` in luna's (relative) numbering.
    pub quote: Option<(u32, u32)>,
}

/// IP header fields written before a packet's flags: `(tos 0x28)`, `(ttl 3)`, `[ect0]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpFields {
    pub tos: Option<u8>,
    pub ttl: Option<u8>,
    /// `noecn`, `ect0`, `ect1`, `ce`, `ect01`, or `ecn` for the `(ecn)` form.
    pub ecn: Option<String>,
}

/// `<` (injected into luna) or `>` (expected from luna).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Inbound,
    Outbound,
}

/// TCP flag bits as the wire carries them.
pub mod flag {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
    pub const URG: u8 = 0x20;
    pub const ECE: u8 = 0x40;
    pub const CWR: u8 = 0x80;
}

/// A TCP packet line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacketSpec {
    pub dir: Direction,
    pub flags: u8,
    /// Start of the sequence range (relative for outbound, literal for inbound).
    pub seq: u32,
    /// Payload length (the range's `(len)`).
    pub len: u32,
    pub ack: Option<u32>,
    pub win: Option<u16>,
    pub urg: Option<u16>,
    /// `None`: no option list written (the packet carries no options).
    pub options: Option<OptionSpec>,
    /// luna extension `rport N`: the remote (scripted) end's port.
    pub rport: Option<u16>,
    /// luna extension `lport N`: luna's port.
    pub lport: Option<u16>,
    /// `...(0)`: any sequence number (outbound).
    pub seq_any: bool,
    /// IP header fields, parsed (docs/packetdrill.md says which are checked).
    pub ip: IpFields,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionSpec {
    /// `<...>`: any options.
    Any,
    List(Vec<Opt>),
}

/// One TCP option, in the order written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opt {
    Nop,
    Eol,
    Mss(u16),
    WScale(u8),
    SackOk,
    Sack(Vec<(u32, u32)>),
    Ts {
        val: u32,
        ecr: u32,
    },
    /// An option the subset cannot write, as decoded from luna: (kind, total length).
    Unknown(u8, usize),
}

impl Opt {
    /// Bytes on the wire.
    pub fn wire_len(&self) -> usize {
        match self {
            Opt::Nop | Opt::Eol => 1,
            Opt::Mss(_) => 4,
            Opt::WScale(_) => 3,
            Opt::SackOk => 2,
            Opt::Sack(b) => 2 + 8 * b.len(),
            Opt::Ts { .. } => 10,
            Opt::Unknown(_, len) => *len,
        }
    }
}

impl fmt::Display for Opt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Opt::Nop => f.write_str("nop"),
            Opt::Eol => f.write_str("eol"),
            Opt::Mss(v) => write!(f, "mss {v}"),
            Opt::WScale(v) => write!(f, "wscale {v}"),
            Opt::SackOk => f.write_str("sackOK"),
            Opt::Sack(b) => {
                f.write_str("sack")?;
                for (l, r) in b {
                    write!(f, " {l}:{r}")?;
                }
                Ok(())
            }
            Opt::Ts { val, ecr } => write!(f, "TS val {val} ecr {ecr}"),
            Opt::Unknown(kind, len) => write!(f, "kind{kind} len {len}"),
        }
    }
}

/// A system call line: `name(args) = ret [ERRNO (text)]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Syscall {
    pub name: String,
    pub args: Vec<Arg>,
    pub ret: i64,
    pub errno: Option<String>,
}

/// A system call argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg {
    /// `...`: whatever the runner supplies.
    Ellipsis,
    Int(i64),
    /// A symbol such as `SOCK_STREAM`, or `O_RDWR|O_NONBLOCK` (the parts).
    Ident(Vec<String>),
    /// `[1]`.
    Array(Vec<Arg>),
    /// `{tcpi_state=TCP_ESTABLISHED}`.
    Struct(Vec<(String, Arg)>),
    /// `"text"`.
    Str(String),
    /// `htons(8080)`, `inet_addr("192.0.2.1")`.
    Call(String, Vec<Arg>),
}

impl fmt::Display for Arg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arg::Ellipsis => f.write_str("..."),
            Arg::Int(v) => write!(f, "{v}"),
            Arg::Ident(parts) => f.write_str(&parts.join("|")),
            Arg::Array(v) => {
                f.write_str("[")?;
                for (i, a) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{a}")?;
                }
                f.write_str("]")
            }
            Arg::Str(t) => write!(f, "{t:?}"),
            Arg::Call(n, v) => {
                write!(f, "{n}(")?;
                for (i, a) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{a}")?;
                }
                f.write_str(")")
            }
            Arg::Struct(v) => {
                f.write_str("{")?;
                for (i, (k, a)) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{k}={a}")?;
                }
                f.write_str("}")
            }
        }
    }
}

/// Replace `//` and `/* */` comments by spaces, keeping line numbers.
fn strip_comments(text: &str, errors: &mut Option<ScriptError>) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut line = 1;
    while i < b.len() {
        if b[i] == '/' && b.get(i + 1) == Some(&'/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if b[i] == '/' && b.get(i + 1) == Some(&'*') {
            let start_line = line;
            i += 2;
            loop {
                if i >= b.len() {
                    errors.get_or_insert(ScriptError::new(start_line, "unterminated /* comment"));
                    return out;
                }
                if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    i += 2;
                    out.push(' ');
                    break;
                }
                if b[i] == '\n' {
                    line += 1;
                    out.push('\n');
                }
                i += 1;
            }
        } else {
            if b[i] == '\n' {
                line += 1;
            }
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Per-run choices that change how a script parses: the names `#ifdef` tests.
#[derive(Debug, Clone)]
pub struct ParseOptions {
    pub defines: Vec<String>,
}

impl Default for ParseOptions {
    fn default() -> Self {
        ParseOptions {
            defines: vec!["Linux".to_string()],
        }
    }
}

/// Parse a whole script with the default defines (`Linux`).
pub fn parse(text: &str) -> Result<Script> {
    parse_with(text, &ParseOptions::default())
}

/// One `#ifdef` level: whether its lines are active, whether a branch was taken.
struct Cond {
    parent_active: bool,
    active: bool,
    seen_else: bool,
    line: usize,
}

/// Statements after comments, `#ifdef` and multi-line `` `...` `` / `%{ }%` blocks are
/// resolved: (first line, text).
fn statements(clean: &str, opts: &ParseOptions) -> Result<Vec<(usize, String)>> {
    let mut out = Vec::new();
    let mut defines: Vec<String> = opts.defines.clone();
    let mut conds: Vec<Cond> = Vec::new();
    // An open block: (first line, text so far, closing token).
    let mut open: Option<(usize, String, &str)> = None;
    for (i, raw) in clean.lines().enumerate() {
        let line = i + 1;
        if let Some((l0, mut text, close)) = open.take() {
            text.push('\n');
            text.push_str(raw);
            if raw.contains(close) {
                out.push((l0, text));
            } else {
                open = Some((l0, text, close));
            }
            continue;
        }
        let s = raw.trim();
        if s.is_empty() {
            continue;
        }
        let active = conds.last().is_none_or(|c| c.active);
        if let Some(d) = s.strip_prefix('#') {
            let mut w = d.split_whitespace();
            let dir = w.next().unwrap_or("");
            let name = w.next();
            if w.next().is_some() {
                return Err(ScriptError::new(
                    line,
                    format!("`{s}`: one name per directive"),
                ));
            }
            match (dir, name) {
                ("ifdef" | "ifndef", Some(n)) => {
                    let def = defines.iter().any(|d| d == n);
                    let cond = if dir == "ifdef" { def } else { !def };
                    conds.push(Cond {
                        parent_active: active,
                        active: active && cond,
                        seen_else: false,
                        line,
                    });
                }
                ("else", None) => match conds.last_mut() {
                    Some(c) if !c.seen_else => {
                        c.seen_else = true;
                        c.active = c.parent_active && !c.active;
                    }
                    _ => return Err(ScriptError::new(line, "#else without #ifdef")),
                },
                ("endif", None) => {
                    if conds.pop().is_none() {
                        return Err(ScriptError::new(line, "#endif without #ifdef"));
                    }
                }
                ("define", Some(n)) if active => defines.push(n.to_string()),
                ("define", Some(_)) => {}
                _ => {
                    return Err(ScriptError::new(
                        line,
                        format!("unsupported directive `{s}` (supported: #ifdef, #ifndef, #else, #endif, #define)"),
                    ))
                }
            }
            continue;
        }
        if !active {
            continue;
        }
        let ticks = s.matches('`').count();
        if ticks % 2 == 1 {
            open = Some((line, s.to_string(), "`"));
        } else if s.contains("%{") && !s[s.find("%{").unwrap_or(0)..].contains("}%") {
            open = Some((line, s.to_string(), "}%"));
        } else {
            out.push((line, s.to_string()));
        }
    }
    if let Some((l0, _, close)) = open {
        return Err(ScriptError::new(
            l0,
            format!("unterminated block (missing `{close}`)"),
        ));
    }
    if let Some(c) = conds.last() {
        return Err(ScriptError::new(c.line, "#ifdef without #endif"));
    }
    Ok(out)
}

/// Parse a whole script, `#ifdef` deciding with `opts.defines`.
pub fn parse_with(text: &str, opts: &ParseOptions) -> Result<Script> {
    let mut err = None;
    let clean = strip_comments(text, &mut err);
    if let Some(e) = err {
        return Err(e);
    }
    let mut script = Script {
        options: Vec::new(),
        events: Vec::new(),
    };
    // Untimed shell commands and python blocks (`../common/defaults.sh` at the top) do not
    // end the header.
    let mut timed = false;
    for (line, s) in statements(&clean, opts)? {
        let s = s.as_str();
        let short = s
            .strip_prefix('-')
            .filter(|r| r.starts_with(|c: char| c.is_ascii_alphabetic())); // `-v`
        if let Some(opt) = s.strip_prefix("--").or(short) {
            if timed {
                return Err(ScriptError::new(
                    line,
                    "header options (--name=value) must come before the first event",
                ));
            }
            let (name, value) = opt.split_once('=').unwrap_or((opt, ""));
            let name = name.trim();
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(ScriptError::new(line, format!("bad header option `{s}`")));
            }
            script
                .options
                .push((line, name.to_string(), value.trim().to_string()));
            continue;
        }
        if let Some(body) = s.strip_prefix('`') {
            let cmd = body.rsplit_once('`').map_or(body, |(c, _)| c);
            script.events.push(Event {
                line,
                time: Time::Rel(0),
                end: None,
                kind: EventKind::Shell(cmd.to_string()),
            });
            continue;
        }
        if s.starts_with("%{") {
            script.events.push(Event {
                line,
                time: Time::Rel(0),
                end: None,
                kind: EventKind::Python(s.to_string()),
            });
            continue;
        }
        timed = true;
        script.events.push(Parser::new(s, line).event()?);
    }
    Ok(script)
}

/// A cursor over one statement.
struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
    line: usize,
}

impl<'a> Parser<'a> {
    fn new(s: &'a str, line: usize) -> Self {
        Parser {
            s: s.as_bytes(),
            pos: 0,
            line,
        }
    }

    fn err<T>(&self, msg: impl Into<String>) -> Result<T> {
        Err(ScriptError::new(self.line, msg))
    }

    fn rest(&self) -> &'a str {
        std::str::from_utf8(&self.s[self.pos..]).unwrap_or("")
    }

    fn ws(&mut self) {
        while self.pos < self.s.len() && self.s[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.s[self.pos..].starts_with(lit.as_bytes()) {
            self.pos += lit.len();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, lit: &str) -> Result<()> {
        self.ws();
        if self.eat(lit) {
            Ok(())
        } else {
            self.err(format!("expected `{lit}` at `{}`", self.rest()))
        }
    }

    fn word(&mut self) -> &'a str {
        let start = self.pos;
        while self.pos < self.s.len()
            && (self.s[self.pos].is_ascii_alphanumeric() || self.s[self.pos] == b'_')
        {
            self.pos += 1;
        }
        std::str::from_utf8(&self.s[start..self.pos]).unwrap_or("")
    }

    /// Seconds with up to six decimals (`0.100`, `.1`, `2`) as microseconds.
    fn seconds(&mut self) -> Result<u64> {
        let start = self.pos;
        let mut int: u64 = 0;
        let mut digits = 0;
        while let Some(c @ b'0'..=b'9') = self.peek() {
            int = int
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(c - b'0')))
                .ok_or_else(|| ScriptError::new(self.line, "time out of range"))?;
            digits += 1;
            self.pos += 1;
        }
        let mut frac: u64 = 0;
        let mut fdigits = 0;
        // A '.' followed by a digit is a fraction; `...` is the blocking-call range.
        if self.peek() == Some(b'.') && self.s.get(self.pos + 1).is_some_and(u8::is_ascii_digit) {
            self.pos += 1;
            while let Some(c @ b'0'..=b'9') = self.peek() {
                if fdigits == 6 {
                    return self.err("times have at most 6 decimals (microseconds)");
                }
                frac = frac * 10 + u64::from(c - b'0');
                fdigits += 1;
                self.pos += 1;
            }
        }
        if digits == 0 && fdigits == 0 {
            self.pos = start;
            return self.err(format!("expected a time at `{}`", self.rest()));
        }
        for _ in fdigits..6 {
            frac *= 10;
        }
        int.checked_mul(1_000_000)
            .and_then(|v| v.checked_add(frac))
            .ok_or_else(|| ScriptError::new(self.line, "time out of range"))
    }

    fn time(&mut self) -> Result<Time> {
        self.ws();
        if self.eat("*") {
            return Ok(Time::Any);
        }
        if self.eat("+") {
            self.ws(); // `+ 0.1` (FreeBSD corpus spacing)
            return Ok(Time::Rel(self.seconds()?));
        }
        if self.peek() == Some(b'-') {
            return self.err("negative times are not supported");
        }
        Ok(Time::Abs(self.seconds()?))
    }

    fn event(&mut self) -> Result<Event> {
        let time = self.time()?;
        let mut end = None;
        if self.eat("...") {
            let e = self.time()?;
            if e == Time::Any || time == Time::Any {
                return self.err("`*` cannot be part of a start...end range");
            }
            end = Some(e);
        }
        self.ws();
        if self.peek() == Some(b'`') || self.rest().starts_with("%{") {
            if end.is_some() || time == Time::Any {
                return self.err("shell commands and python blocks take a plain time");
            }
            let rest = self.rest();
            let kind = match rest.strip_prefix('`') {
                Some(body) => {
                    EventKind::Shell(body.rsplit_once('`').map_or(body, |(c, _)| c).to_string())
                }
                None => EventKind::Python(rest.to_string()),
            };
            return Ok(Event {
                line: self.line,
                time,
                end,
                kind,
            });
        }
        let kind = match self.peek() {
            Some(c @ (b'<' | b'>')) => {
                if end.is_some() {
                    return self.err("only system calls take a start...end time range");
                }
                if c == b'<' && time == Time::Any {
                    return self.err("`*` timing is only for outbound packets");
                }
                self.packet_or_icmp()?
            }
            Some(c) if c.is_ascii_alphabetic() => {
                if time == Time::Any {
                    return self.err("`*` timing is only for outbound packets");
                }
                EventKind::Syscall(self.syscall()?)
            }
            _ => {
                return self.err(format!(
                    "expected a packet or system call at `{}`",
                    self.rest()
                ))
            }
        };
        Ok(Event {
            line: self.line,
            time,
            end,
            kind,
        })
    }

    fn number_u64(&mut self) -> Result<u64> {
        self.ws();
        let start = self.pos;
        let v = if self.eat("0x") || self.eat("0X") {
            let hs = self.pos;
            while self.peek().is_some_and(|c| c.is_ascii_hexdigit()) {
                self.pos += 1;
            }
            let h = std::str::from_utf8(&self.s[hs..self.pos]).unwrap_or("");
            u64::from_str_radix(h, 16).ok()
        } else {
            while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                self.pos += 1;
            }
            std::str::from_utf8(&self.s[start..self.pos])
                .ok()
                .and_then(|d| d.parse().ok())
        };
        match v {
            Some(v) => Ok(v),
            None => {
                self.pos = start;
                self.err(format!("expected a number at `{}`", self.rest()))
            }
        }
    }

    fn number<T: TryFrom<u64>>(&mut self, what: &str) -> Result<T> {
        let v = self.number_u64()?;
        T::try_from(v).or_else(|_| self.err(format!("{what} {v} is out of range")))
    }

    fn skip<T>(&self, msg: impl Into<String>) -> Result<T> {
        Err(ScriptError::skip(self.line, msg))
    }

    /// `(tos 0x28)`, `(ttl 3)`, `(ecn)`, `[ect0]` before a packet's flags.
    fn ip_fields(&mut self) -> Result<IpFields> {
        let mut ip = IpFields::default();
        loop {
            self.ws();
            if self.eat("[") {
                let w = self.word().to_string();
                self.expect("]")?;
                match w.as_str() {
                    "noecn" | "ect0" | "ect1" | "ect01" | "ce" => ip.ecn = Some(w),
                    _ => return self.err(format!("unknown ECN codepoint `[{w}]`")),
                }
            } else if self.eat("(") {
                loop {
                    self.ws();
                    let k = self.word().to_string();
                    match k.as_str() {
                        "tos" => ip.tos = Some(self.number("tos")?),
                        "ttl" => ip.ttl = Some(self.number("ttl")?),
                        "ecn" => ip.ecn = Some(k),
                        "hlim" | "class" | "flowlabel" => {
                            return self.skip(format!("IPv6 header field `{k}`: IPv4 only"))
                        }
                        "" => {
                            return self.err(format!("expected an IP field at `{}`", self.rest()))
                        }
                        _ => return self.skip(format!("IP header field `{k}` is not supported")),
                    }
                    self.ws();
                    if self.eat(")") {
                        break;
                    }
                    self.expect(",")?;
                }
            } else {
                return Ok(ip);
            }
        }
    }

    fn packet_or_icmp(&mut self) -> Result<EventKind> {
        let dir = if self.eat("<") {
            Direction::Inbound
        } else {
            self.pos += 1;
            Direction::Outbound
        };
        let ip = self.ip_fields()?;
        self.ws();
        let save = self.pos;
        let w = self.word();
        if w == "icmp" {
            return Ok(EventKind::Icmp(self.icmp(dir)?));
        }
        self.pos = save;
        let mut p = self.packet(dir)?;
        p.ip = ip;
        Ok(EventKind::Packet(p))
    }

    /// After `icmp`: `type [code] [mtu N] [[start:end(len)]]`.
    fn icmp(&mut self, dir: Direction) -> Result<IcmpSpec> {
        self.ws();
        let kind = self.word().to_string();
        if kind.is_empty() {
            return self.err("an icmp line needs a type, e.g. `icmp unreachable frag_needed`");
        }
        let mut spec = IcmpSpec {
            dir,
            kind,
            code: String::new(),
            mtu: None,
            quote: None,
        };
        loop {
            self.ws();
            if self.pos >= self.s.len() {
                return Ok(spec);
            }
            if self.eat("[") {
                self.ws();
                let a: u32 = self.number("sequence number")?;
                self.expect(":")?;
                let b: u32 = self.number("sequence number")?;
                self.expect("(")?;
                let len: u32 = self.number("length")?;
                self.expect(")")?;
                self.expect("]")?;
                if b.wrapping_sub(a) != len {
                    return self.err(format!("quoted range {a}:{b} does not span {len}"));
                }
                spec.quote = Some((a, b));
                continue;
            }
            let w = self.word().to_string();
            match w.as_str() {
                "mtu" => spec.mtu = Some(self.number("mtu")?),
                "" => return self.err(format!("unexpected `{}` in an icmp line", self.rest())),
                _ if spec.code.is_empty() => spec.code = w,
                _ => return self.err(format!("unexpected `{w}` in an icmp line")),
            }
        }
    }

    fn packet(&mut self, dir: Direction) -> Result<PacketSpec> {
        // Flags: a run of F S R P . U E W (packetdrill's letters; `.` is ACK).
        let fstart = self.pos;
        while self.peek().is_some_and(|c| !c.is_ascii_whitespace()) {
            self.pos += 1;
        }
        let ftok = std::str::from_utf8(&self.s[fstart..self.pos]).unwrap_or("");
        if matches!(ftok, "udp" | "UDP" | "ICMP" | "encap" | "sctp") || ftok.starts_with("udp") {
            return self.skip(format!("`{ftok}` packets are not supported: TCP only"));
        }
        let mut flags = 0u8;
        // `-`: no flags at all.
        for c in ftok.chars().filter(|_| ftok != "-") {
            let bit = match c {
                'F' => flag::FIN,
                'S' => flag::SYN,
                'R' => flag::RST,
                'P' => flag::PSH,
                '.' => flag::ACK,
                'U' => flag::URG,
                'E' => flag::ECE,
                'W' => flag::CWR,
                _ => return self.err(format!("unknown TCP flag `{c}` in `{ftok}`")),
            };
            if flags & bit != 0 {
                return self.err(format!("flag `{c}` repeated in `{ftok}`"));
            }
            flags |= bit;
        }
        if ftok.is_empty() {
            return self.err("expected TCP flags after the direction");
        }
        // start:end(len), or `...(len)` for any sequence number.
        self.ws();
        let seq_any = self.eat("...");
        let (seq, end) = if seq_any {
            (0, 0)
        } else {
            let seq: u32 = self.number("sequence number")?;
            self.expect(":")?;
            (seq, self.number("sequence number")?)
        };
        self.expect("(")?;
        let len: u32 = self.number("payload length")?;
        self.expect(")")?;
        let end = if seq_any { len } else { end };
        if end.wrapping_sub(seq) != len {
            return self.err(format!(
                "sequence range {seq}:{end} does not span the payload length {len}"
            ));
        }
        let mut p = PacketSpec {
            dir,
            flags,
            seq,
            len,
            ack: None,
            win: None,
            urg: None,
            options: None,
            rport: None,
            lport: None,
            seq_any,
            ip: IpFields::default(),
        };
        loop {
            self.ws();
            if self.pos >= self.s.len() {
                break;
            }
            if self.peek() == Some(b'<') {
                if p.options.is_some() {
                    return self.err("option list given twice");
                }
                p.options = Some(self.options()?);
                continue;
            }
            if self.peek() == Some(b'/') {
                return self.skip(format!("encapsulation `{}` is not supported", self.rest()));
            }
            let kw = self.word();
            match kw {
                "ack" => p.ack = Some(self.number("ack")?),
                "win" => p.win = Some(self.number("window")?),
                "urg" => p.urg = Some(self.number("urgent pointer")?),
                "rport" => p.rport = Some(self.number("port")?),
                "lport" => p.lport = Some(self.number("port")?),
                "" => return self.err(format!("unexpected `{}` in packet", self.rest())),
                other => {
                    return self.err(format!(
                    "unsupported packet keyword `{other}` (supported: ack, win, urg, <options>, \
                         and the luna extensions rport, lport)"
                ))
                }
            }
        }
        if seq_any && dir == Direction::Inbound {
            return self.err("`...` as a sequence number is only meaningful on outbound packets");
        }
        if dir == Direction::Inbound {
            if p.options == Some(OptionSpec::Any) {
                return self.err("`<...>` is only meaningful on outbound packets");
            }
            if flags & flag::ACK != 0 && p.ack.is_none() {
                return self.err("an inbound packet with the ACK flag needs `ack N`");
            }
            if p.win.is_none() && flags & flag::RST == 0 {
                return self.err("an inbound packet needs `win N` (only RSTs default to 0)");
            }
        }
        Ok(p)
    }

    fn options(&mut self) -> Result<OptionSpec> {
        self.pos += 1; // '<'
        let start = self.pos;
        while self.peek().is_some_and(|c| c != b'>') {
            self.pos += 1;
        }
        if self.peek() != Some(b'>') {
            return self.err("unterminated option list (missing `>`)");
        }
        let body = std::str::from_utf8(&self.s[start..self.pos]).unwrap_or("");
        self.pos += 1;
        if body.trim() == "..." {
            return Ok(OptionSpec::Any);
        }
        if body.trim().is_empty() {
            return Ok(OptionSpec::List(Vec::new()));
        }
        let mut out = Vec::new();
        for item in body.split(',') {
            let toks: Vec<&str> = item.split_whitespace().collect();
            let num = |i: usize, max: u64| -> Result<u64> {
                let t = toks.get(i).ok_or_else(|| {
                    ScriptError::new(self.line, format!("option `{item}` needs a value"))
                })?;
                let v: u64 = t.parse().map_err(|_| {
                    ScriptError::new(
                        self.line,
                        format!("bad number `{t}` in option `{}`", item.trim()),
                    )
                })?;
                if v > max {
                    return Err(ScriptError::new(
                        self.line,
                        format!("value {v} too large in option `{}`", item.trim()),
                    ));
                }
                Ok(v)
            };
            let opt = match toks.as_slice() {
                ["nop"] => Opt::Nop,
                ["eol"] => Opt::Eol,
                ["sackOK"] => Opt::SackOk,
                ["mss", _] => Opt::Mss(num(1, 0xffff)? as u16),
                ["wscale", _] => Opt::WScale(num(1, 0xff)? as u8),
                ["TS", "val", _, "ecr", _] => Opt::Ts {
                    val: num(2, 0xffff_ffff)? as u32,
                    ecr: num(4, 0xffff_ffff)? as u32,
                },
                ["sack", blocks @ ..] if !blocks.is_empty() => {
                    if blocks.len() > 4 {
                        return self.err("at most 4 SACK blocks fit in a TCP header");
                    }
                    let mut v = Vec::new();
                    for b in blocks {
                        let (l, r) = b
                            .split_once(':')
                            .and_then(|(l, r)| {
                                Some((l.parse::<u32>().ok()?, r.parse::<u32>().ok()?))
                            })
                            .ok_or_else(|| {
                                ScriptError::new(
                                    self.line,
                                    format!("bad SACK block `{b}` (want L:R)"),
                                )
                            })?;
                        v.push((l, r));
                    }
                    Opt::Sack(v)
                }
                ["..."] => return self.err("`...` must be the whole option list: `<...>`"),
                _ => {
                    return self.skip(format!(
                    "unsupported TCP option `{}` (supported: nop, eol, mss N, wscale N, sackOK, \
                         sack L:R..., TS val N ecr N)",
                    item.trim()
                ))
                }
            };
            out.push(opt);
        }
        let total: usize = out.iter().map(Opt::wire_len).sum();
        if total > 40 {
            return self.err(format!("options take {total} bytes; a TCP header holds 40"));
        }
        Ok(OptionSpec::List(out))
    }

    fn syscall(&mut self) -> Result<Syscall> {
        let name = self.word().to_string();
        self.expect("(")?;
        let mut args = Vec::new();
        self.ws();
        if !self.eat(")") {
            loop {
                args.push(self.arg()?);
                self.ws();
                if self.eat(",") {
                    continue;
                }
                if self.eat(")") {
                    break;
                }
                return self.err(format!("expected `,` or `)` at `{}`", self.rest()));
            }
        }
        self.expect("=")?;
        self.ws();
        let neg = self.eat("-");
        let v: i64 = self.number("return value")?;
        let ret = if neg { -v } else { v };
        self.ws();
        let mut errno = None;
        if self.peek().is_some_and(|c| c.is_ascii_alphabetic()) {
            errno = Some(self.word().to_string());
        }
        self.ws();
        if self.peek() == Some(b'(') {
            // The errno's description, e.g. `(Operation now in progress)`: free text.
            let mut depth = 0;
            while let Some(c) = self.peek() {
                self.pos += 1;
                if c == b'(' {
                    depth += 1;
                } else if c == b')' {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
            }
            if depth != 0 {
                return self.err("unterminated `(` after the return value");
            }
        }
        self.ws();
        if self.pos < self.s.len() {
            return self.err(format!(
                "unexpected `{}` after the return value",
                self.rest()
            ));
        }
        if ret == -1 && errno.is_none() {
            return self.err("a -1 return needs an errno name, e.g. `= -1 EAGAIN`");
        }
        if ret != -1 && errno.is_some() {
            return self.err("an errno name goes only with a -1 return");
        }
        Ok(Syscall {
            name,
            args,
            ret,
            errno,
        })
    }

    fn arg(&mut self) -> Result<Arg> {
        self.ws();
        if self.eat("...") {
            return Ok(Arg::Ellipsis);
        }
        if self.eat("[") {
            let mut v = Vec::new();
            self.ws();
            if !self.eat("]") {
                loop {
                    v.push(self.arg()?);
                    self.ws();
                    if self.eat(",") {
                        continue;
                    }
                    if self.eat("]") {
                        break;
                    }
                    return self.err(format!("expected `,` or `]` at `{}`", self.rest()));
                }
            }
            return Ok(Arg::Array(v));
        }
        if self.eat("{") {
            let mut v = Vec::new();
            loop {
                self.ws();
                if self.eat("}") {
                    break;
                }
                if self.eat("...") {
                    self.ws();
                    self.eat(",");
                    continue;
                }
                let mut k = self.word().to_string();
                if k.is_empty() {
                    return self.err(format!("expected field=value at `{}`", self.rest()));
                }
                if self.eat("(...)") {
                    k.push_str("(...)"); // `msg_name(...)=...`
                }
                self.expect("=")?;
                v.push((k, self.arg()?));
                self.ws();
                if !self.eat(",") {
                    self.expect("}")?;
                    break;
                }
            }
            return Ok(Arg::Struct(v));
        }
        if self.peek() == Some(b'-') || self.peek().is_some_and(|c| c.is_ascii_digit()) {
            let neg = self.eat("-");
            let v: i64 = self.number("argument")?;
            return Ok(Arg::Int(if neg { -v } else { v }));
        }
        if self.eat("\"") {
            let start = self.pos;
            while self.peek().is_some_and(|c| c != b'"') {
                self.pos += 1;
            }
            let t = std::str::from_utf8(&self.s[start..self.pos])
                .unwrap_or("")
                .to_string();
            if !self.eat("\"") {
                return self.err("unterminated string argument");
            }
            return Ok(Arg::Str(t));
        }
        let mut parts = Vec::new();
        loop {
            self.ws();
            let w = self.word();
            if w.is_empty() {
                return self.err(format!("unexpected `{}` in arguments", self.rest()));
            }
            parts.push(w.to_string());
            self.ws();
            if parts.len() == 1 && self.eat("(") {
                // A function-like argument: `htons(8080)`, `inet_addr("192.0.2.1")`.
                let mut v = Vec::new();
                self.ws();
                if !self.eat(")") {
                    loop {
                        v.push(self.arg()?);
                        self.ws();
                        if self.eat(",") {
                            continue;
                        }
                        self.expect(")")?;
                        break;
                    }
                }
                return Ok(Arg::Call(parts.remove(0), v));
            }
            if !self.eat("|") {
                break;
            }
        }
        Ok(Arg::Ident(parts))
    }
}
