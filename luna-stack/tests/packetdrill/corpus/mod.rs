//! The generated corpus: regular families of packetdrill scripts (states × segment kinds ×
//! sequence and ACK positions, overlaps with SACK/D-SACK, zero window, window scaling,
//! PAWS, MSS, keepalive), each stating the RFC rule it proves in its header.
//!
//! The generator writes `corpus/<family>/<name>.pkt`, which are committed so that outside
//! testers can read and run them without Rust: `current_files` fails when the committed
//! files differ from the generator's output; `LPD_REGEN=1` rewrites them. Each family is
//! one test that runs every script of the family and names each failure; scripts luna is
//! known to fail are listed in `expected_failures.txt` like the hand-written ones.
//! docs/packetdrill.md, "Generated corpus", has the matrix and the counts.

mod families;
mod states;

use crate::packetdrill::{manifest, run_text, ExpectedFailure};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// One generated script.
pub struct Script {
    pub family: &'static str,
    pub name: String,
    pub text: String,
}

/// Every family, in order (each has a `family_<name>` test below).
pub const FAMILIES: &[&str] = &["state", "ovl", "zwnd", "wscale", "paws", "mss", "keepalive"];

pub fn generate() -> Vec<Script> {
    let mut out = Vec::new();
    states::generate(&mut out);
    families::generate(&mut out);
    out
}

/// Append `text` as `// ` comment lines wrapped at 100 columns (continuation lines indented).
pub fn comment(out: &mut String, text: &str) {
    let mut line = String::from("//");
    for w in text.split_whitespace() {
        if line.len() + 1 + w.len() > 100 && line.len() > 4 {
            out.push_str(&line);
            out.push('\n');
            line = String::from("//  ");
        }
        line.push(' ');
        line.push_str(w);
    }
    out.push_str(&line);
    out.push('\n');
}

pub fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/packetdrill/corpus")
}

/// The committed scripts: (family, name) → text.
fn on_disk() -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    for fam in FAMILIES {
        let Ok(rd) = std::fs::read_dir(corpus_dir().join(fam)) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "pkt") {
                let name = p.file_stem().unwrap().to_string_lossy().into_owned();
                let text = std::fs::read_to_string(&p).expect("corpus file readable");
                out.insert((fam.to_string(), name), text);
            }
        }
    }
    out
}

/// Names of every committed corpus script (for the manifest check).
pub fn names() -> Vec<String> {
    on_disk().into_keys().map(|(_, n)| n).collect()
}

#[test]
fn current_files() {
    let gen = generate();
    let mut seen = std::collections::BTreeSet::new();
    for s in &gen {
        assert!(
            FAMILIES.contains(&s.family),
            "family {} not in FAMILIES",
            s.family
        );
        assert!(seen.insert(s.name.clone()), "duplicate name {}", s.name);
    }
    let disk = on_disk();
    if std::env::var_os("LPD_REGEN").is_some() {
        for (fam, name) in disk.keys() {
            if !gen.iter().any(|s| s.family == fam && &s.name == name) {
                std::fs::remove_file(corpus_dir().join(fam).join(format!("{name}.pkt")))
                    .expect("remove stale corpus file");
            }
        }
        for s in &gen {
            let dir = corpus_dir().join(s.family);
            std::fs::create_dir_all(&dir).expect("corpus dir");
            let path = dir.join(format!("{}.pkt", s.name));
            if disk.get(&(s.family.to_string(), s.name.clone())) != Some(&s.text) {
                std::fs::write(&path, &s.text).expect("write corpus file");
            }
        }
        println!("corpus: wrote {} scripts", gen.len());
        return;
    }
    let mut stale = Vec::new();
    for s in &gen {
        if disk.get(&(s.family.to_string(), s.name.clone())) != Some(&s.text) {
            stale.push(format!("{}/{}.pkt", s.family, s.name));
        }
    }
    for (fam, name) in disk.keys() {
        if !gen.iter().any(|s| s.family == fam && &s.name == name) {
            stale.push(format!("{fam}/{name}.pkt (no longer generated)"));
        }
    }
    assert!(
        stale.is_empty(),
        "the committed corpus differs from the generator; run \
         `LPD_REGEN=1 cargo test -p luna-stack --test packetdrill -- corpus::current_files`:\n{}",
        stale.join("\n")
    );
}

/// Pass, expected failure (the manifest's line), skip (a construct the runner cannot do:
/// a failure for our own scripts, counted apart), or a failure message naming the script.
pub enum Verdict {
    Pass,
    ExpectedFail,
    Skip(String),
    Fail(String),
}

/// Run one script and hold it to the manifest.
pub fn judge(name: &str, text: &str, xfail: &BTreeMap<String, ExpectedFailure>) -> Verdict {
    match (run_text(text), xfail.get(name)) {
        (Ok(_), None) => Verdict::Pass,
        (Err(f), None) if f.error.skip => Verdict::Skip(format!(
            "{name}.pkt:{}: skipped (our scripts must run): {}",
            f.error.line, f.error.msg
        )),
        (Err(f), None) => Verdict::Fail(format!(
            "{name}.pkt:{} (seed {:#x}): {}",
            f.error.line, f.seed, f.error.msg
        )),
        (Err(f), Some(x)) if f.error.line == x.line => Verdict::ExpectedFail,
        (Err(f), Some(x)) => Verdict::Fail(format!(
            "{name}.pkt: the manifest expects a failure at line {} but it failed at line {}: {}",
            x.line, f.error.line, f.error.msg
        )),
        (Ok(_), Some(x)) => Verdict::Fail(format!(
            "{name}.pkt now passes but expected_failures.txt lists it (line {}, {}): delete the entry",
            x.line, x.rfc
        )),
    }
}

/// Counts of one directory of scripts, and what went wrong (skips and failures).
#[derive(Default)]
pub struct Tally {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
    pub expected_fail: usize,
    pub problems: Vec<String>,
}

impl Tally {
    pub fn add(&mut self, v: Verdict) {
        match v {
            Verdict::Pass => self.passed += 1,
            Verdict::ExpectedFail => self.expected_fail += 1,
            Verdict::Skip(e) => {
                self.skipped += 1;
                self.problems.push(e);
            }
            Verdict::Fail(e) => {
                self.failed += 1;
                self.problems.push(e);
            }
        }
    }

    pub fn total(&self) -> usize {
        self.passed + self.failed + self.skipped + self.expected_fail
    }

    /// `passed / failed / skipped / expected-fail` columns, as `make test` prints them.
    pub fn row(&self, dir: &str) -> String {
        format!(
            "{dir:<28} {:>6} {:>6} {:>7} {:>13} {:>6}",
            self.passed,
            self.failed,
            self.skipped,
            self.expected_fail,
            self.total()
        )
    }
}

/// The header of [`Tally::row`]'s table.
pub const TALLY_HEADER: &str =
    "directory                    passed failed skipped expected-fail  total";

/// Run every committed script of `family` (or only `LPD_CORPUS=<name>`).
pub fn tally_family(family: &str) -> Tally {
    let xfail = manifest().expect("manifest parses");
    let only = std::env::var("LPD_CORPUS").ok();
    let mut t = Tally::default();
    for ((fam, name), text) in on_disk() {
        if fam != family || only.as_ref().is_some_and(|o| o != &name) {
            continue;
        }
        let v = judge(&name, &text, &xfail);
        if let Verdict::Fail(e) | Verdict::Skip(e) = v {
            t.add(Verdict::Fail(format!("{family}/{e}")));
        } else {
            t.add(v);
        }
    }
    assert!(
        only.is_some() || t.total() > 0,
        "no scripts for family {family}"
    );
    t
}

/// One family alone (the `family_*` tests: `pass_counts` runs them all in `make test`).
fn run_family(family: &str) {
    let t = tally_family(family);
    println!("{}\n{}", TALLY_HEADER, t.row(&format!("corpus/{family}")));
    assert!(t.problems.is_empty(), "{}", t.problems.join("\n\n"));
}

/// Counts over the whole corpus without running it (the family tests run it).
#[test]
fn counts() {
    let xfail = manifest().expect("manifest parses");
    let disk = on_disk();
    for fam in FAMILIES {
        let n = disk.keys().filter(|(f, _)| f == fam).count();
        let x = disk
            .keys()
            .filter(|(f, n)| f == fam && xfail.contains_key(n))
            .count();
        println!("corpus {fam}: {n} scripts, {x} expected to fail");
    }
    let x = disk.keys().filter(|(_, n)| xfail.contains_key(n)).count();
    println!(
        "corpus total: {} scripts, {} expected to fail, {} expected to pass",
        disk.len(),
        x,
        disk.len() - x
    );
    assert!(disk.len() >= 400, "the corpus shrank to {}", disk.len());
}

#[test]
#[ignore = "run by pass_counts (make test); alone: -- --ignored family_state"]
fn family_state() {
    run_family("state");
}

#[test]
#[ignore = "run by pass_counts (make test); alone: -- --ignored family_ovl"]
fn family_ovl() {
    run_family("ovl");
}

#[test]
#[ignore = "run by pass_counts (make test); alone: -- --ignored family_zwnd"]
fn family_zwnd() {
    run_family("zwnd");
}

#[test]
#[ignore = "run by pass_counts (make test); alone: -- --ignored family_wscale"]
fn family_wscale() {
    run_family("wscale");
}

#[test]
#[ignore = "run by pass_counts (make test); alone: -- --ignored family_paws"]
fn family_paws() {
    run_family("paws");
}

#[test]
#[ignore = "run by pass_counts (make test); alone: -- --ignored family_mss"]
fn family_mss() {
    run_family("mss");
}

#[test]
#[ignore = "run by pass_counts (make test); alone: -- --ignored family_keepalive"]
fn family_keepalive() {
    run_family("keepalive");
}
