//! The cross-thread message scheduler (not written yet).
