//! Protocol parsers beyond knb's own framing, each behind [`crate::parser::Parser`].
//!
//! - [`memcached`]: the memcached text and binary protocols on one port.

pub mod memcached;
