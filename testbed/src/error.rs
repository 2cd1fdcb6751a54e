//! The testbed's error type: every failure names what went wrong and how to fix it.

use std::path::PathBuf;
use std::time::Duration;

/// Result alias for the testbed.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while building, impairing or removing a topology.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The caller is not root; namespaces, links and qdiscs need CAP_NET_ADMIN.
    #[error("the testbed needs root (network namespaces, links, qdiscs, hugepages); fix: run as root, e.g. `sudo make test`")]
    NotRoot,
    /// A required external tool is not in PATH.
    #[error("`{tool}` not found in PATH; fix: run `make setup` (or `apt-get install {package}`)")]
    MissingTool {
        /// The binary that was looked for.
        tool: &'static str,
        /// The Debian package that ships it.
        package: &'static str,
    },
    /// A topology name that the testbed does not know.
    #[error("unknown topology `{given}`; valid topologies: {valid}")]
    UnknownTopology {
        /// What the caller asked for.
        given: String,
        /// Comma-separated valid names.
        valid: String,
    },
    /// An impairable link name that this topology does not have.
    #[error("no impairable link `{given}` in {scope}; valid links: {valid}")]
    UnknownLink {
        /// Where it was looked for (`topology veth`, `any topology`).
        scope: String,
        /// What the caller asked for.
        given: String,
        /// Comma-separated valid names (may be "none").
        valid: String,
    },
    /// The name prefix is unusable (interface names are limited to 15 bytes).
    #[error("invalid prefix `{given}`: {why}")]
    BadPrefix {
        /// What the caller gave.
        given: String,
        /// Why it was refused.
        why: &'static str,
    },
    /// A configuration value the environment cannot support.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// An impairment parameter is out of range or inconsistent.
    #[error("invalid impairment: {0}")]
    BadImpairment(String),
    /// A value given on the command line could not be parsed.
    #[error("cannot parse {what} `{given}`: {why}")]
    Parse {
        /// What kind of value (percentage, duration, rate).
        what: &'static str,
        /// The text given.
        given: String,
        /// Expected form.
        why: &'static str,
    },
    /// An external command failed.
    #[error("command `{cmd}` failed ({status}): {stderr}")]
    Command {
        /// The command line, for copy-paste.
        cmd: String,
        /// Exit status description.
        status: String,
        /// Its trimmed stderr.
        stderr: String,
    },
    /// Waiting for something (an interface, a daemon) ran out of time.
    #[error("timed out after {after:?} waiting for {what}; {hint}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long we waited.
        after: Duration,
        /// What to check.
        hint: &'static str,
    },
    /// A topology that should exist does not.
    #[error("topology `{topology}` with prefix `{prefix}` is not up; fix: `testbed up {topology} --prefix {prefix}`")]
    NotUp {
        /// The topology name.
        topology: &'static str,
        /// The prefix.
        prefix: String,
    },
    /// The kernel lacks sch_netem and the netem backend was forced.
    #[error("the kernel has no netem qdisc (sch_netem); fix: unset LUNA_TESTBED_IMPAIR (the user-space nfqueue backend then applies the same impairments) or use a kernel with CONFIG_NET_SCH_NETEM")]
    NetemUnsupported,
    /// The user-space impairment engine failed.
    #[error("impairment engine: {0}")]
    Engine(String),
    /// Filesystem or socket I/O failed.
    #[error("{context}: {source}")]
    Io {
        /// What we were doing, with the path.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn io_path(what: &str, path: &std::path::Path, source: std::io::Error) -> Self {
        Error::io(format!("{what} {}", PathBuf::from(path).display()), source)
    }
}
