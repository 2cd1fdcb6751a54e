//! HTTP/2 (RFC 9113) with HPACK (RFC 7541) as a msgsched session protocol.
pub mod hpack;
