//! What a [`Syncer`](crate::Syncer) saw, live: its socket calls, the datagrams it read, and
//! where its (re-)dump stands — for a failure message when the mirror stops following the
//! kernel. The published [`Snapshot`](crate::Snapshot)'s counters stop moving while a
//! re-dump is in progress (nothing is published until it ends), so they cannot tell a
//! syncer that reads nothing from one whose re-dump never ends; this can.
//!
//! The syncer keeps a [`SyncTrace`] and copies it into a [`TraceHandle`] at the end of
//! every [`Syncer::poll`](crate::Syncer::poll) (at least every 50 ms while it runs).

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use netlink_packet_core::{NLMSG_DONE, NLMSG_ERROR, NLMSG_NOOP, NLMSG_OVERRUN, NLM_F_MULTIPART};

use crate::mirror::SyncCounters;

/// How many events the trace keeps (the most recent).
pub const TRACE_EVENTS: usize = 64;

/// One thing the syncer did or read. Consecutive notification datagrams are one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceEvent {
    /// A dump request went out.
    Sent {
        /// Which dump.
        dump: &'static str,
        /// Its sequence number.
        seq: u32,
    },
    /// Datagrams of notifications only (no dump reply, no `NLMSG_DONE`/`NLMSG_ERROR`).
    Notifications {
        /// Datagrams in a row.
        datagrams: u64,
        /// Netlink messages in them.
        messages: u64,
    },
    /// A datagram of a dump's reply (multipart messages with that dump's sequence number).
    DumpPart {
        /// Its sequence number.
        seq: u32,
        /// Netlink messages in it.
        messages: u32,
    },
    /// `NLMSG_DONE` of a dump.
    Done {
        /// Its sequence number.
        seq: u32,
    },
    /// `NLMSG_ERROR` carrying an error (not an ACK).
    ErrorAck {
        /// The request's sequence number.
        seq: u32,
        /// The (positive) errno.
        errno: i32,
    },
    /// `NLMSG_OVERRUN` from the kernel.
    OverrunMessage,
    /// `recv` failed with this errno (`ENOBUFS`: the kernel dropped notifications).
    RecvError {
        /// The errno.
        errno: i32,
    },
    /// A datagram larger than the buffer (`MSG_TRUNC`).
    Truncated {
        /// Its real length.
        len: usize,
    },
    /// A (re-)dump started; `abandoned` names the dump in flight whose end it waits for.
    Resync {
        /// The in-flight dump given up (its replies are read for their end only).
        abandoned: Option<u32>,
    },
    /// The staging mirror replaced the tables and a snapshot was published.
    Published {
        /// Its version.
        version: u64,
    },
    /// The receive buffer after an attempt to grow it (`SO_RCVBUF` as the kernel reports it).
    Rcvbuf {
        /// Bytes.
        bytes: usize,
    },
}

impl fmt::Display for TraceEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceEvent::Sent { dump, seq } => write!(f, "sent {dump} dump seq {seq}"),
            TraceEvent::Notifications {
                datagrams,
                messages,
            } => write!(f, "notifications ({datagrams} datagrams, {messages} msgs)"),
            TraceEvent::DumpPart { seq, messages } => {
                write!(f, "dump part seq {seq} ({messages} msgs)")
            }
            TraceEvent::Done { seq } => write!(f, "done seq {seq}"),
            TraceEvent::ErrorAck { seq, errno } => {
                write!(f, "error seq {seq} errno {errno} ({})", errno_name(*errno))
            }
            TraceEvent::OverrunMessage => write!(f, "NLMSG_OVERRUN"),
            TraceEvent::RecvError { errno } => {
                write!(f, "recv errno {errno} ({})", errno_name(*errno))
            }
            TraceEvent::Truncated { len } => write!(f, "truncated datagram of {len} bytes"),
            TraceEvent::Resync { abandoned: None } => write!(f, "resync"),
            TraceEvent::Resync {
                abandoned: Some(seq),
            } => write!(f, "resync (abandons seq {seq})"),
            TraceEvent::Published { version } => write!(f, "published v{version}"),
            TraceEvent::Rcvbuf { bytes } => write!(f, "rcvbuf {bytes}"),
        }
    }
}

fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::ENOBUFS => "ENOBUFS",
        libc::EBUSY => "EBUSY",
        libc::EINTR => "EINTR",
        libc::EAGAIN => "EAGAIN",
        libc::EINVAL => "EINVAL",
        libc::ENOMEM => "ENOMEM",
        _ => "?",
    }
}

/// The syncer's live state and what it has seen since it opened its socket.
#[derive(Debug, Clone)]
pub struct SyncTrace {
    /// The socket's netlink port id (`Pid` in `/proc/net/netlink`, see [`kernel_socket_line`]).
    pub port_id: u32,
    /// `poll(2)` calls, and how many of them said readable (the rest timed out or were
    /// interrupted).
    pub polls: u64,
    /// `poll(2)` calls that returned the socket readable.
    pub polls_readable: u64,
    /// Datagrams read.
    pub datagrams: u64,
    /// `recv` that found nothing (`EAGAIN`): the kernel had emptied the queue.
    pub would_block: u64,
    /// `recv` that failed with `ENOBUFS` (the kernel dropped notifications).
    pub enobufs: u64,
    /// Netlink messages read that were notifications (not part of a dump's reply).
    pub notifications: u64,
    /// Netlink messages read that were part of a dump's reply (multipart).
    pub dump_messages: u64,
    /// `NLMSG_DONE` read.
    pub dones: u64,
    /// `NLMSG_ERROR` carrying an error read, as (errno, count).
    pub error_acks: Vec<(i32, u64)>,
    /// Dump requests sent.
    pub requests: u64,
    /// The dump in flight (name, sequence number) and when it was sent.
    pub in_flight: Option<(&'static str, u32, Instant)>,
    /// Whether the dump in flight was abandoned (a re-dump waits for its end).
    pub in_flight_abandoned: bool,
    /// The last datagram that was a reply of the dump in flight (dump part, done or error).
    pub last_in_flight_reply: Option<Instant>,
    /// A (re-)dump is in progress (readers see the last complete snapshot).
    pub staging: bool,
    /// Dumps still to request in this (re-)dump.
    pub queued: usize,
    /// The last published version.
    pub version: u64,
    /// The live counters (published or not).
    pub counters: SyncCounters,
    /// The receive buffer (`SO_RCVBUF` as the kernel reports it), last read.
    pub rcvbuf: usize,
    /// When the trace was last copied out.
    pub at: Instant,
    /// The last [`TRACE_EVENTS`] events, oldest first.
    pub events: VecDeque<TraceEvent>,
}

impl Default for SyncTrace {
    fn default() -> Self {
        SyncTrace {
            port_id: 0,
            polls: 0,
            polls_readable: 0,
            datagrams: 0,
            would_block: 0,
            enobufs: 0,
            notifications: 0,
            dump_messages: 0,
            dones: 0,
            error_acks: Vec::new(),
            requests: 0,
            in_flight: None,
            in_flight_abandoned: false,
            last_in_flight_reply: None,
            staging: false,
            queued: 0,
            version: 0,
            counters: SyncCounters::default(),
            rcvbuf: 0,
            at: Instant::now(),
            events: VecDeque::with_capacity(TRACE_EVENTS),
        }
    }
}

impl SyncTrace {
    /// Appends `e`, merging runs of notification datagrams, dropping the oldest past
    /// [`TRACE_EVENTS`].
    pub(crate) fn event(&mut self, e: TraceEvent) {
        if let (
            Some(TraceEvent::Notifications {
                datagrams,
                messages,
            }),
            TraceEvent::Notifications {
                datagrams: d,
                messages: m,
            },
        ) = (self.events.back_mut(), &e)
        {
            *datagrams += d;
            *messages += m;
            return;
        }
        if self.events.len() == TRACE_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(e);
    }

    pub(crate) fn error_ack(&mut self, errno: i32) {
        match self.error_acks.iter_mut().find(|(e, _)| *e == errno) {
            Some((_, n)) => *n += 1,
            None => self.error_acks.push((errno, 1)),
        }
    }

    /// Records the datagram in `buf` (headers only): counts its messages by kind and
    /// appends its events. `in_flight` is the sequence number of the dump in flight.
    pub(crate) fn datagram(&mut self, buf: &[u8], in_flight: Option<u32>) {
        self.datagrams += 1;
        let mut off = 0usize;
        let mut notes = 0u64;
        let mut part: Option<(u32, u32)> = None;
        let mut ends = Vec::new();
        while off + 16 <= buf.len() {
            let b = &buf[off..];
            let len = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize;
            let kind = u16::from_ne_bytes([b[4], b[5]]);
            let flags = u16::from_ne_bytes([b[6], b[7]]);
            let seq = u32::from_ne_bytes([b[8], b[9], b[10], b[11]]);
            match kind {
                NLMSG_NOOP => {}
                NLMSG_DONE => {
                    self.dones += 1;
                    ends.push(TraceEvent::Done { seq });
                }
                NLMSG_ERROR => {
                    let code = if b.len() >= 20 {
                        i32::from_ne_bytes([b[16], b[17], b[18], b[19]])
                    } else {
                        0
                    };
                    if code != 0 {
                        self.error_ack(-code);
                        ends.push(TraceEvent::ErrorAck { seq, errno: -code });
                    }
                }
                NLMSG_OVERRUN => ends.push(TraceEvent::OverrunMessage),
                _ if flags & NLM_F_MULTIPART != 0 => {
                    self.dump_messages += 1;
                    match &mut part {
                        Some((s, n)) if *s == seq => *n += 1,
                        _ => part = Some((seq, 1)),
                    }
                }
                _ => {
                    self.notifications += 1;
                    notes += 1;
                }
            }
            if len < 16 {
                break;
            }
            off += (len + 3) & !3;
        }
        let replied = part.is_some_and(|(s, _)| Some(s) == in_flight)
            || ends.iter().any(|e| match e {
                TraceEvent::Done { seq } | TraceEvent::ErrorAck { seq, .. } => {
                    Some(*seq) == in_flight
                }
                _ => false,
            });
        if replied {
            self.last_in_flight_reply = Some(Instant::now());
        }
        if notes > 0 {
            self.event(TraceEvent::Notifications {
                datagrams: 1,
                messages: notes,
            });
        }
        if let Some((seq, messages)) = part {
            self.event(TraceEvent::DumpPart { seq, messages });
        }
        for e in ends {
            self.event(e);
        }
    }
}

impl fmt::Display for SyncTrace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ago = |t: Instant| self.at.saturating_duration_since(t);
        writeln!(
            f,
            "syncer (port id {}, as of {:?} ago): polls {} (readable {}), datagrams {}, recv EAGAIN {}, recv ENOBUFS {}; messages: notifications {}, dump {}, done {}, error acks {:?} (errno, count); requests sent {}; rcvbuf {}",
            self.port_id,
            self.at.elapsed(),
            self.polls,
            self.polls_readable,
            self.datagrams,
            self.would_block,
            self.enobufs,
            self.notifications,
            self.dump_messages,
            self.dones,
            self.error_acks,
            self.requests,
            self.rcvbuf
        )?;
        match self.in_flight {
            Some((dump, seq, sent)) => write!(
                f,
                "  dump in flight: {dump} seq {seq}, sent {:?} before, abandoned {}, last reply of it {:?} before",
                ago(sent),
                self.in_flight_abandoned,
                self.last_in_flight_reply.map(ago)
            )?,
            None => write!(f, "  no dump in flight")?,
        }
        writeln!(
            f,
            "; staging {}, dumps queued {}, version {}; live {:?}",
            self.staging, self.queued, self.version, self.counters
        )?;
        write!(f, "  last events:")?;
        for e in &self.events {
            write!(f, " | {e}")?;
        }
        Ok(())
    }
}

/// A copy of a syncer's [`SyncTrace`], refreshed by the syncer while it polls.
#[derive(Debug, Clone, Default)]
pub struct TraceHandle(Arc<Mutex<SyncTrace>>);

impl TraceHandle {
    /// The trace as of the syncer's last poll.
    pub fn get(&self) -> SyncTrace {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn set(&self, t: &SyncTrace) {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        g.clone_from(t);
        g.at = Instant::now();
    }
}

/// The kernel's line for the netlink socket with port id `port_id` in
/// `/proc/thread-self/net/netlink` (the calling thread's network namespace):
/// `sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode`, with the header. `Dump` non-zero
/// means the kernel runs a dump for the socket; `Rmem` is the bytes queued on it; `Drops`
/// counts what the kernel could not queue.
pub fn kernel_socket_line(port_id: u32) -> Option<String> {
    let text = std::fs::read_to_string("/proc/thread-self/net/netlink").ok()?;
    let mut lines = text.lines();
    let header = lines
        .next()?
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let row = lines.find(|l| {
        let f: Vec<_> = l.split_whitespace().collect();
        f.len() > 2 && f[1] == "0" && f[2] == port_id.to_string()
    })?;
    Some(format!(
        "{header}: {}",
        row.split_whitespace().collect::<Vec<_>>().join(" ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::craft::{done, emit, route};
    use netlink_packet_route::RouteNetlinkMessage as M;

    #[test]
    fn a_datagram_is_counted_by_kind_and_notification_runs_merge() {
        let mut t = SyncTrace::default();
        let r = route(2, "198.19.0.0".parse().unwrap(), 16, None, 0);
        let note = emit(M::NewRoute(r.clone()), 0, 0);
        t.datagram(&note, Some(7));
        t.datagram(&note, Some(7));
        let mut part = emit(M::NewRoute(r), NLM_F_MULTIPART, 7);
        part.extend(done(7));
        t.datagram(&part, Some(7));
        assert_eq!(
            (t.datagrams, t.notifications, t.dump_messages, t.dones),
            (3, 2, 1, 1)
        );
        assert!(t.last_in_flight_reply.is_some());
        assert_eq!(
            Vec::from(t.events.clone()),
            [
                TraceEvent::Notifications {
                    datagrams: 2,
                    messages: 2
                },
                TraceEvent::DumpPart {
                    seq: 7,
                    messages: 1
                },
                TraceEvent::Done { seq: 7 },
            ]
        );
        for _ in 0..2 * TRACE_EVENTS {
            t.event(TraceEvent::Done { seq: 1 });
        }
        assert_eq!(t.events.len(), TRACE_EVENTS);
        assert!(t.to_string().contains("done seq 1"));
    }
}
