//! The name prefix: everything the testbed creates (namespaces, interfaces, state dir,
//! DPDK file prefixes) starts with it, so concurrent runs and tests never collide and
//! [`crate::sweep()`] can find leftovers.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::error::{Error, Result};

/// Default prefix: the project's name.
pub const DEFAULT_PREFIX: &str = "luna";
/// Environment variable that overrides the default prefix.
pub const PREFIX_ENV: &str = "LUNA_TESTBED_PREFIX";
/// Environment variable that overrides the state root (default `/run/luna-testbed`).
pub const STATE_ROOT_ENV: &str = "LUNA_TESTBED_STATE_ROOT";
/// Default state root: tmpfs, so a reboot clears it along with the namespaces.
pub const DEFAULT_STATE_ROOT: &str = "/run/luna-testbed";

/// Longest prefix: `<prefix>-` plus the longest interface suffix (3, e.g. `k1v`; one spare)
/// must fit the 15 bytes of an interface name.
pub const MAX_PREFIX_LEN: usize = 10;

/// A validated name prefix: 1–10 characters, lowercase ASCII letters and digits, starting
/// with a letter.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Prefix(String);

impl Prefix {
    /// Validates `s`.
    pub fn new(s: &str) -> Result<Prefix> {
        let bad = |why| {
            Err(Error::BadPrefix {
                given: s.to_string(),
                why,
            })
        };
        if s.is_empty() {
            return bad("empty");
        }
        if s.len() > MAX_PREFIX_LEN {
            return bad("longer than 10 characters (interface names are limited to 15 bytes)");
        }
        if !s.starts_with(|c: char| c.is_ascii_lowercase()) {
            return bad("must start with a lowercase letter");
        }
        if !s
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        {
            return bad("only lowercase ASCII letters and digits are allowed");
        }
        Ok(Prefix(s.to_string()))
    }

    /// `$LUNA_TESTBED_PREFIX` if set, else `luna`.
    pub fn from_env() -> Result<Prefix> {
        match std::env::var(PREFIX_ENV) {
            Ok(s) if !s.is_empty() => Prefix::new(&s),
            _ => Ok(Prefix(DEFAULT_PREFIX.to_string())),
        }
    }

    /// The prefix text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `<prefix>-<suffix>`: the name of a namespace, interface or DPDK file prefix.
    pub fn name(&self, suffix: &str) -> String {
        format!("{}-{}", self.0, suffix)
    }

    /// The state directory of this prefix: `<state root>/<prefix>`.
    pub fn state_dir(&self) -> PathBuf {
        state_root().join(&self.0)
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Prefix {
    type Err = Error;
    fn from_str(s: &str) -> Result<Prefix> {
        Prefix::new(s)
    }
}

/// `$LUNA_TESTBED_STATE_ROOT` if set, else `/run/luna-testbed`.
pub fn state_root() -> PathBuf {
    match std::env::var_os(STATE_ROOT_ENV) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(DEFAULT_STATE_ROOT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_short_lowercase() {
        assert_eq!(Prefix::new("luna").unwrap().name("k1"), "luna-k1");
        assert!(Prefix::new("ltb1234567").is_ok());
    }

    #[test]
    fn rejects_bad_prefixes_with_reason() {
        for bad in ["", "toolongprefix", "1abc", "Luna", "lu-na", "lu na"] {
            let e = Prefix::new(bad).unwrap_err().to_string();
            assert!(e.contains("invalid prefix"), "{bad}: {e}");
        }
    }
}
