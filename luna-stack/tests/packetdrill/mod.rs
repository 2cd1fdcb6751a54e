//! A packetdrill-syntax conformance runner for luna-stack (sans-IO, deterministic).
//!
//! `script` parses the language subset, `packet` builds and decodes frames with luna's
//! `wire` module, `engine` runs a script against one `Stack` on virtual time. Scripts live
//! in `scripts/*.pkt`; known luna failures are listed in `expected_failures.txt`.
//! docs/packetdrill.md describes the subset and the scripts.

pub mod engine;
pub mod packet;
pub mod script;

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Every script runs once per seed: the seed changes luna's ISNs, timestamp offsets and
/// ephemeral ports, which the script's relative numbering must hide.
pub const SEEDS: [u64; 2] = [1, 0x5eed_1e55];

/// The directory of the `.pkt` scripts.
pub fn scripts_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/packetdrill/scripts")
}

/// A script failure: which seed, which line, what.
#[derive(Debug, Clone)]
pub struct Failure {
    pub seed: u64,
    pub error: script::ScriptError,
}

/// Parse and run a script under every seed.
pub fn run_text(text: &str) -> Result<engine::Outcome, Failure> {
    run_text_with(text, &engine::RunOptions::default())
}

/// Parse (with the run's `#ifdef` names) and run a script under every seed.
pub fn run_text_with(text: &str, opts: &engine::RunOptions) -> Result<engine::Outcome, Failure> {
    let parsed = script::parse_with(text, &opts.parse_options())
        .map_err(|error| Failure { seed: 0, error })?;
    let mut last = None;
    for seed in SEEDS {
        last =
            Some(engine::run_with(&parsed, seed, opts).map_err(|error| Failure { seed, error })?);
    }
    Ok(last.expect("SEEDS is not empty"))
}

/// A script luna is known to fail (a luna bug the script exposes), from the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedFailure {
    /// The line the script fails at.
    pub line: usize,
    /// The RFC rule luna breaks.
    pub rfc: String,
    /// What goes wrong.
    pub reason: String,
}

/// `expected_failures.txt`: `script.pkt | line | RFC rule | reason`, `#` comments.
pub fn manifest() -> Result<BTreeMap<String, ExpectedFailure>, String> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/packetdrill/expected_failures.txt");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_manifest(&text)
}

pub fn parse_manifest(text: &str) -> Result<BTreeMap<String, ExpectedFailure>, String> {
    let mut out = BTreeMap::new();
    for (i, l) in text.lines().enumerate() {
        let l = l.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let parts: Vec<&str> = l.splitn(4, '|').map(str::trim).collect();
        let [script, line, rfc, reason] = parts[..] else {
            return Err(format!(
                "manifest line {}: want `script.pkt | line | RFC | reason`",
                i + 1
            ));
        };
        let name = script
            .strip_suffix(".pkt")
            .ok_or_else(|| format!("manifest line {}: `{script}` is not a .pkt name", i + 1))?;
        let line = line
            .parse()
            .map_err(|_| format!("manifest line {}: bad line number `{line}`", i + 1))?;
        if rfc.is_empty() || reason.is_empty() {
            return Err(format!(
                "manifest line {}: the RFC rule and reason are required",
                i + 1
            ));
        }
        let e = ExpectedFailure {
            line,
            rfc: rfc.to_string(),
            reason: reason.to_string(),
        };
        if out.insert(name.to_string(), e).is_some() {
            return Err(format!("manifest line {}: `{script}` listed twice", i + 1));
        }
    }
    Ok(out)
}
