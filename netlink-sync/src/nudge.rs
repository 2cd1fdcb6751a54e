//! Making the kernel resolve a next hop, from an ordinary kernel socket.
//!
//! A zero-length UDP datagram to the next hop's discard port (9) makes the kernel route it,
//! find no neighbour entry, and send an ARP request; the answer arrives as `RTM_NEWNEIGH`
//! through the syncer. With an exception interface the driver may instead send the queued
//! packet itself through it (same effect); this helper is what the tests use today. The
//! socket can be bound to the mirrored interface (`SO_BINDTODEVICE`) so the kernel resolves
//! on that interface even when its own routes would pick another.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};

/// The discard port (RFC 863): nothing listens on it, so the peer at most answers ICMP.
pub const DISCARD_PORT: u16 = 9;

/// A kernel UDP socket that nudges the kernel into resolving next hops.
#[derive(Debug)]
pub struct Nudger {
    sock: UdpSocket,
}

impl Nudger {
    /// A non-blocking socket in the calling thread's network namespace, bound to `device`
    /// if given.
    pub fn new(device: Option<&str>) -> io::Result<Nudger> {
        let sock = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))?;
        sock.set_nonblocking(true)?;
        if let Some(dev) = device {
            nix::sys::socket::setsockopt(
                &sock,
                nix::sys::socket::sockopt::BindToDevice,
                &std::ffi::OsString::from(dev),
            )
            .map_err(io::Error::from)?;
        }
        Ok(Nudger { sock })
    }

    /// Asks the kernel to resolve `next_hop`. `WouldBlock` (the kernel's queue for an
    /// unresolved neighbour is full) means a resolution is already under way.
    pub fn nudge(&self, next_hop: Ipv4Addr) -> io::Result<()> {
        match self
            .sock
            .send_to(&[], SocketAddrV4::new(next_hop, DISCARD_PORT))
        {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e),
        }
    }
}
