//! Backquoted shell commands. packetdrill runs them with `system()` and fails the script
//! when one exits non-zero; the runner recognises the forms other stacks' scripts use and
//! answers them from luna: sysctl assignments (`sysctl`), the corpora's reset helpers, state
//! checks over the connection table (`ss`/`sockstat`/`netstat` piped into `grep`) and
//! `tcpdrop -s STATE`. Any other command skips the script with the command as the reason.

use super::sysctl::{self, Target};
use super::{Runner, ScriptError};
use crate::packetdrill::script::Result;
use luna_stack::tcp::State;

/// Split a command text into commands (newline, `;`, `&&`), each a pipeline (`|`) of stages,
/// each a list of words; quotes are removed, `\`-newline joins lines, redirections dropped.
pub fn split(cmd: &str) -> std::result::Result<Vec<Vec<Vec<String>>>, String> {
    let text = cmd.replace("\\\n", " ");
    let mut cmds = Vec::new();
    let mut pipeline: Vec<Vec<String>> = Vec::new();
    let mut stage: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = text.chars().peekable();
    let end_word = |word: &mut String, in_word: &mut bool, stage: &mut Vec<String>| {
        if *in_word {
            stage.push(std::mem::take(word));
            *in_word = false;
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some(q) if q == c => break,
                        Some(x) => word.push(x),
                        None => return Err(format!("unterminated quote in `{cmd}`")),
                    }
                }
            }
            ' ' | '\t' => end_word(&mut word, &mut in_word, &mut stage),
            '|' if chars.peek() == Some(&'|') => return Err("`||` in a shell command".into()),
            '|' => {
                end_word(&mut word, &mut in_word, &mut stage);
                pipeline.push(std::mem::take(&mut stage));
            }
            '\n' | ';' | '&' => {
                if c == '&' && chars.peek() != Some(&'&') {
                    // `2>&1` is a redirection; a lone `&` (background) is not supported.
                    if word.ends_with('>') {
                        word.push(c);
                        in_word = true;
                        continue;
                    }
                    return Err("a background `&` in a shell command".into());
                }
                if c == '&' {
                    chars.next();
                }
                end_word(&mut word, &mut in_word, &mut stage);
                pipeline.push(std::mem::take(&mut stage));
                cmds.push(std::mem::take(&mut pipeline));
            }
            _ => {
                word.push(c);
                in_word = true;
            }
        }
    }
    end_word(&mut word, &mut in_word, &mut stage);
    pipeline.push(stage);
    cmds.push(pipeline);
    // Drop redirections (`> /dev/null`, `2>&1`, `>/dev/null`) and empty stages/commands.
    let mut out = Vec::new();
    for p in cmds {
        let mut stages = Vec::new();
        for s in p {
            let mut words = Vec::new();
            let mut skip_next = false;
            for w in s {
                if skip_next {
                    skip_next = false;
                    continue;
                }
                let redirect = w.trim_start_matches(|c: char| c.is_ascii_digit());
                if redirect.starts_with('>') || redirect.starts_with('<') {
                    skip_next = matches!(redirect, ">" | ">>" | "<");
                    continue;
                }
                words.push(w);
            }
            if !words.is_empty() {
                stages.push(words);
            }
        }
        if !stages.is_empty() {
            out.push(stages);
        }
    }
    Ok(out)
}

/// A state name in any tool's spelling (`TIME_WAIT`, `time-wait`, `FIN_WAIT1`, `ESTAB`,
/// `SYN_RCVD`, `SYN-RECV`...), as luna's state; `Some(None)` is LISTEN.
fn state_word(w: &str) -> Option<Option<State>> {
    let n: String = w
        .to_ascii_uppercase()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    Some(Some(match n.as_str() {
        "ESTABLISHED" | "ESTAB" => State::Established,
        "SYNSENT" => State::SynSent,
        "SYNRECV" | "SYNRCVD" | "SYNRECEIVED" => State::SynReceived,
        "FINWAIT1" => State::FinWait1,
        "FINWAIT2" => State::FinWait2,
        "CLOSEWAIT" => State::CloseWait,
        "CLOSING" => State::Closing,
        "LASTACK" => State::LastAck,
        "TIMEWAIT" => State::TimeWait,
        "CLOSE" | "CLOSED" => State::Closed,
        "LISTEN" | "LISTENING" => return Some(None),
        _ => return None,
    }))
}

/// One row of the connection table: state (None: LISTEN), luna's port, the peer's port.
type Row = (Option<State>, u16, u16);

impl Runner {
    /// Run a backquoted command at the current time.
    pub(super) fn shell(&mut self, cmd: &str) -> Result<()> {
        let cmds = split(cmd).map_err(|e| ScriptError::skip(self.line, e))?;
        for pipeline in cmds {
            let ok = self.shell_pipeline(&pipeline)?;
            if !ok {
                let text: Vec<String> = pipeline.iter().map(|s| s.join(" ")).collect();
                return self.err(format!(
                    "shell command `{}` failed (luna's answer: exit status 1)",
                    text.join(" | ")
                ));
            }
        }
        Ok(())
    }

    /// One pipeline; true if it "exits 0".
    fn shell_pipeline(&mut self, stages: &[Vec<String>]) -> Result<bool> {
        let words = &stages[0];
        let (negate, words) = match words.split_first() {
            Some((b, rest)) if b == "!" => (true, rest.to_vec()),
            _ => (false, words.clone()),
        };
        let Some(prog) = words.first() else {
            return Ok(!negate);
        };
        let base = prog.rsplit('/').next().unwrap_or(prog);
        let whole = stages
            .iter()
            .map(|s| s.join(" "))
            .collect::<Vec<_>>()
            .join(" | ");
        let single = stages.len() == 1;
        let ok = match base {
            // The corpora's "reset to production defaults" helpers: each run starts from a
            // fresh Stack with luna's defaults (and the --peer profile).
            "defaults.sh" if single => true,
            b if b.starts_with("sysctl_restore") && single => true,
            "sysctl" if single => {
                self.sysctl(&words[1..])?;
                true
            }
            "ss" | "sockstat" | "netstat" => self.state_check(base, &words, &stages[1..])?,
            "tcpdrop" if single => {
                self.tcpdrop(&words)?;
                true
            }
            _ => {
                return Err(ScriptError::skip(
                    self.line,
                    format!("shell command `{whole}` is not supported"),
                ))
            }
        };
        Ok(ok != negate)
    }

    fn sysctl(&mut self, args: &[String]) -> Result<()> {
        let mut any = false;
        for a in args {
            if matches!(a.as_str(), "-q" | "-w" | "-e") {
                continue;
            }
            let Some((name, v)) = a.split_once('=') else {
                return Err(ScriptError::skip(
                    self.line,
                    format!("sysctl `{a}`: only assignments are supported"),
                ));
            };
            any = true;
            let before = (format!("{:?}", self.cfg), format!("{:?}", self.keepalive));
            let mut t = Target {
                cfg: &mut self.cfg,
                keepalive: &mut self.keepalive,
                state: &mut self.sysctls,
            };
            if let Err(why) = sysctl::apply(&mut t, name, v) {
                return Err(ScriptError::skip(self.line, why));
            }
            let after = (format!("{:?}", self.cfg), format!("{:?}", self.keepalive));
            if self.stack.is_some() && before != after {
                return Err(ScriptError::skip(
                    self.line,
                    format!(
                        "sysctl {name}={v} after the first listen/connect/packet: luna's \
                         configuration is fixed once the stack runs"
                    ),
                ));
            }
        }
        if !any {
            return Err(ScriptError::skip(self.line, "sysctl without an assignment"));
        }
        Ok(())
    }

    /// Every connection the runner can see: listeners and connections it accepted or
    /// opened (closed ones until luna reclaims them). `None` if luna holds connections no
    /// fd ever named (not yet accepted): their states are not observable.
    fn table(&mut self) -> Option<Vec<Row>> {
        let stack = self.stack.as_ref()?;
        let mut rows = Vec::new();
        let mut live = 0;
        for h in &self.known {
            if let Some(c) = stack.connection(*h) {
                live += 1;
                let t = c.tuple();
                rows.push((Some(c.state()), t.local.port(), t.remote.port()));
            }
        }
        if stack.connection_count() != live {
            return None;
        }
        for f in self.fds.values() {
            if let super::FdKind::Listener(_) = f.kind {
                rows.push((None, f.bound.unwrap_or(super::LUNA_PORT), 0));
            }
        }
        Some(rows)
    }

    /// `ss -tn state X | grep -c P`, `sockstat ... | grep -c STATE | grep N`,
    /// `netstat -n | grep -c STATE`: one line per connection, filtered by state, port or
    /// address; `grep -c`/`wc -l` count; the exit status is grep's.
    fn state_check(&mut self, tool: &str, words: &[String], rest: &[Vec<String>]) -> Result<bool> {
        let whole = || {
            std::iter::once(words.join(" "))
                .chain(rest.iter().map(|s| s.join(" ")))
                .collect::<Vec<_>>()
                .join(" | ")
        };
        let skip = |this: &Self, why: String| -> Result<bool> {
            Err(ScriptError::skip(
                this.line,
                format!("state check `{}`: {why}", whole()),
            ))
        };
        let mut rows =
            if self.stack.is_none() {
                Vec::new()
            } else {
                match self.table() {
                    Some(r) => r,
                    None => return skip(
                        self,
                        "luna holds connections not yet accepted, whose state its API does not \
                         show"
                            .into(),
                    ),
                }
            };
        // Tool filters: `ss state X`, `sockstat -p N` / `-P tcp`.
        let mut i = 1;
        while i < words.len() {
            let w = words[i].as_str();
            match (tool, w) {
                ("ss", "state") => {
                    let Some(s) = words.get(i + 1).and_then(|x| state_word(x)) else {
                        return skip(self, "unknown ss state".into());
                    };
                    rows.retain(|r| r.0 == s);
                    i += 1;
                }
                ("sockstat", "-p") => {
                    let Some(p) = words.get(i + 1).and_then(|x| x.parse::<u16>().ok()) else {
                        return skip(self, "bad sockstat -p".into());
                    };
                    rows.retain(|r| r.1 == p || r.2 == p);
                    i += 1;
                }
                ("sockstat", "-P") => i += 1,
                (_, f) if f.starts_with('-') => {}
                _ => return skip(self, format!("argument `{w}` not understood")),
            }
            i += 1;
        }
        // Then grep stages over the lines, or over the count once counted.
        let mut count: Option<usize> = None;
        let mut status = true;
        for st in rest {
            let prog = st[0].as_str();
            if prog == "wc" && st.get(1).map(String::as_str) == Some("-l") && st.len() == 2 {
                count = Some(count.map_or(rows.len(), |_| 1));
                status = true;
                continue;
            }
            if prog != "grep" {
                return skip(self, format!("`{prog}` in a state check"));
            }
            let mut counting = false;
            let mut pattern = None;
            for w in &st[1..] {
                match w.as_str() {
                    "-c" => counting = true,
                    "-q" | "-w" | "-E" | "-F" => {}
                    f if f.starts_with('-') => return skip(self, format!("grep {f}")),
                    p if pattern.is_none() => pattern = Some(p.to_string()),
                    _ => return skip(self, "grep with several patterns or files".into()),
                }
            }
            let Some(pat) = pattern else {
                return skip(self, "grep without a pattern".into());
            };
            if let Some(n) = count {
                // Grepping the printed count.
                let hit = n.to_string().contains(&pat);
                count = Some(usize::from(hit));
                status = hit;
                if counting {
                    count = Some(usize::from(hit));
                }
                continue;
            }
            let keep: Box<dyn Fn(&Row) -> bool> = if let Some(s) = state_word(&pat) {
                Box::new(move |r: &Row| r.0 == s)
            } else if pat.starts_with("packetdril") || pat == "tcp" || pat == "tcp4" {
                Box::new(|_: &Row| true)
            } else if pat.parse::<std::net::Ipv4Addr>().is_ok() {
                // Every connection is between the script's two addresses.
                Box::new(|_: &Row| true)
            } else if let Ok(p) = pat.trim_start_matches([':', '.']).parse::<u16>() {
                Box::new(move |r: &Row| r.1 == p || r.2 == p)
            } else {
                return skip(self, format!("grep pattern `{pat}` not answerable"));
            };
            rows.retain(|r| keep(r));
            status = !rows.is_empty();
            if counting {
                count = Some(rows.len());
            }
        }
        Ok(status)
    }

    /// `tcpdrop -s STATE` (FreeBSD): drop every connection in that state (luna: abort).
    fn tcpdrop(&mut self, words: &[String]) -> Result<()> {
        let state = match words {
            [_, s, st] if s == "-s" => state_word(st).flatten(),
            _ => None,
        };
        let Some(state) = state else {
            return Err(ScriptError::skip(
                self.line,
                format!(
                    "`{}`: only `tcpdrop -s STATE` is supported",
                    words.join(" ")
                ),
            ));
        };
        if self.table().is_none() {
            return Err(ScriptError::skip(
                self.line,
                "tcpdrop: luna holds connections not yet accepted, whose state its API does \
                 not show",
            ));
        }
        let known = self.known.clone();
        if let Some(stack) = self.stack.as_mut() {
            for h in known {
                if stack.state(h) == Some(state) {
                    stack.abort(h);
                }
            }
        }
        self.drain()
    }
}
