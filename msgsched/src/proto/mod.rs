//! Session protocols: protocols that need more than framing contiguous messages.
pub mod h2;
