//! No import circles between the source files of zbuf and testbed (issue 14): the
//! modules of each crate form a DAG, so a walk through the code never comes back to a
//! file it left. Run with `cargo test -p testbed --test modcycles` (part of `make test`).
//!
//! The checker reads the sources, not the compiler's view, so it needs no extra tool:
//!
//! * Nodes are source files (`lib.rs`, `x.rs`, `x/mod.rs`), found by following `mod x;`
//!   declarations from `src/lib.rs` (all features: `#[cfg(feature = ...)]` is ignored).
//! * An edge `a → b` is a path in `a` that names an item *defined* in `b`: every `use`
//!   tree (`pub use` included) and every qualified path in the code that starts with
//!   `crate`, `self`, `super`, a child module or a name `a` imported. A re-export is an
//!   alias: `crate::Zbuf` counts as an edge to the file that defines `Zbuf`, not to
//!   `lib.rs`.
//! * Comments, doc comments (intra-doc links are not imports), string literals and
//!   `#[cfg(test)]` items (unit test modules) are left out. Inline non-test modules
//!   (`mod x { ... }`) are rejected rather than guessed at; neither crate has one.
//! * Not seen: macros used by textual scope. Neither crate defines one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Crates whose module graph must be acyclic, relative to the workspace root.
const CHECKED: &[&str] = &["zbuf", "testbed"];

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Path,
    Punct(char),
}

/// A token with its 1-based line.
#[derive(Clone, Debug)]
struct T {
    tok: Tok,
    line: usize,
}

/// Removes comments, strings and char literals (keeping line breaks) and splits the
/// rest into tokens.
fn tokenize(src: &str) -> Vec<T> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    let n = c.len();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    while i < n {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < n && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < n {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if ch == '"'
            || (ch == 'b' && at(i + 1) == '"')
            || ((ch == 'r' || (ch == 'b' && at(i + 1) == 'r'))
                && raw_string_hashes(&c, i).is_some())
        {
            // Plain, byte and raw string literals.
            let raw = raw_string_hashes(&c, i);
            if let Some(hashes) = raw {
                while c[i] != '"' {
                    i += 1;
                }
                i += 1;
                loop {
                    if i >= n {
                        break;
                    }
                    if c[i] == '"' && (0..hashes).all(|k| at(i + 1 + k) == '#') {
                        i += 1 + hashes;
                        break;
                    }
                    if c[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            } else {
                while c[i] != '"' {
                    i += 1;
                }
                i += 1;
                while i < n && c[i] != '"' {
                    if c[i] == '\\' {
                        i += 1;
                    }
                    if at(i) == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
        } else if ch == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if at(i + 1) == '\\' {
                i += 2;
                while i < n && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
                while i < n && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let s = i;
            while i < n && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(T {
                tok: Tok::Ident(c[s..i].iter().collect()),
                line,
            });
        } else if ch.is_ascii_digit() {
            // `1_000`, `0x1f`, `2.5`; not the `..` of a range.
            while i < n
                && (c[i].is_alphanumeric()
                    || c[i] == '_'
                    || (c[i] == '.' && at(i + 1).is_ascii_digit()))
            {
                i += 1;
            }
        } else if ch == ':' && at(i + 1) == ':' {
            out.push(T {
                tok: Tok::Path,
                line,
            });
            i += 2;
        } else {
            out.push(T {
                tok: Tok::Punct(ch),
                line,
            });
            i += 1;
        }
    }
    out
}

/// `Some(number of #)` if a raw string literal (`r"`, `r#"`, `br"`) starts at `i`.
fn raw_string_hashes(c: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if c.get(j) == Some(&'b') {
        j += 1;
    }
    if c.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while c.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (c.get(j) == Some(&'"')).then_some(hashes)
}

fn ident(t: &T) -> Option<&str> {
    match &t.tok {
        Tok::Ident(s) => Some(s),
        _ => None,
    }
}

fn is_punct(t: Option<&T>, ch: char) -> bool {
    matches!(t, Some(T { tok: Tok::Punct(c), .. }) if *c == ch)
}

/// Index just past the bracketed group opening at `i` (`(`, `[` or `{`).
fn skip_group(toks: &[T], i: usize) -> usize {
    let mut depth = 0i32;
    let mut j = i;
    while j < toks.len() {
        match toks[j].tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth -= 1;
                if depth == 0 {
                    return j + 1;
                }
            }
            _ => {}
        }
        j += 1;
    }
    toks.len()
}

/// Drops every item carrying `#[cfg(test)]`; errors on an inline non-test module.
fn strip_test_items(toks: Vec<T>, file: &str) -> Result<Vec<T>, String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let is_cfg_test = is_punct(toks.get(i), '#')
            && is_punct(toks.get(i + 1), '[')
            && toks.get(i + 2).and_then(ident) == Some("cfg")
            && is_punct(toks.get(i + 3), '(')
            && toks.get(i + 4).and_then(ident) == Some("test")
            && is_punct(toks.get(i + 5), ')')
            && is_punct(toks.get(i + 6), ']');
        if is_cfg_test {
            i += 7;
            // Further attributes of the same item.
            while is_punct(toks.get(i), '#') && is_punct(toks.get(i + 1), '[') {
                i = skip_group(&toks, i + 1);
            }
            // The item: up to its `;` or through its body.
            while i < toks.len() {
                match toks[i].tok {
                    Tok::Punct(';') => {
                        i += 1;
                        break;
                    }
                    Tok::Punct('{') => {
                        i = skip_group(&toks, i);
                        break;
                    }
                    Tok::Punct('(' | '[') => i = skip_group(&toks, i),
                    _ => i += 1,
                }
            }
            continue;
        }
        if ident(&toks[i]) == Some("mod")
            && toks.get(i + 1).and_then(ident).is_some()
            && is_punct(toks.get(i + 2), '{')
        {
            return Err(format!(
                "{file}:{}: inline module `{}` (not supported by this checker)",
                toks[i].line,
                ident(&toks[i + 1]).unwrap_or_default()
            ));
        }
        out.push(toks[i].clone());
        i += 1;
    }
    Ok(out)
}

/// One leaf of a `use` tree: `alias` names `path` in the importing module.
#[derive(Clone, Debug)]
struct UseLeaf {
    path: Vec<String>,
    /// `None` for a glob.
    alias: Option<String>,
    line: usize,
}

/// Parses a `use` tree starting at `i` with `prefix` already read; returns the index
/// after it.
fn parse_use_tree(toks: &[T], mut i: usize, prefix: Vec<String>, out: &mut Vec<UseLeaf>) -> usize {
    let mut path = prefix;
    let line = toks.get(i).map_or(0, |t| t.line);
    loop {
        match toks.get(i).map(|t| &t.tok) {
            Some(Tok::Path) => i += 1,
            Some(Tok::Ident(s)) => {
                path.push(s.clone());
                i += 1;
                if toks.get(i).map(|t| &t.tok) != Some(&Tok::Path) {
                    let mut alias = path.last().cloned();
                    if toks.get(i).and_then(ident) == Some("as") {
                        alias = toks.get(i + 1).and_then(ident).map(str::to_string);
                        i += 2;
                    }
                    // `x::{self}` names the module `x` itself.
                    if path.last().map(String::as_str) == Some("self") {
                        path.pop();
                        if alias.as_deref() == Some("self") {
                            alias = path.last().cloned();
                        }
                    }
                    out.push(UseLeaf { path, alias, line });
                    return i;
                }
            }
            Some(Tok::Punct('*')) => {
                out.push(UseLeaf {
                    path,
                    alias: None,
                    line,
                });
                return i + 1;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                loop {
                    match toks.get(i).map(|t| &t.tok) {
                        Some(Tok::Punct('}')) | None => return i + 1,
                        Some(Tok::Punct(',')) => i += 1,
                        _ => i = parse_use_tree(toks, i, path.clone(), out),
                    }
                }
            }
            _ => return i,
        }
    }
}

/// What one file says about modules and paths.
#[derive(Debug, Default)]
struct FileFacts {
    /// `mod x;` declarations.
    children: Vec<String>,
    /// Every leaf of every `use` tree.
    uses: Vec<UseLeaf>,
    /// Qualified paths in the code outside `use` items: (segments, line).
    paths: Vec<(Vec<String>, usize)>,
}

fn facts(src: &str, file: &str) -> Result<FileFacts, String> {
    let toks = strip_test_items(tokenize(src), file)?;
    let mut f = FileFacts::default();
    let mut i = 0;
    while i < toks.len() {
        match ident(&toks[i]) {
            Some("mod") if is_punct(toks.get(i + 2), ';') => {
                if let Some(name) = toks.get(i + 1).and_then(ident) {
                    f.children.push(name.to_string());
                }
                i += 3;
            }
            Some("use") => {
                i = parse_use_tree(&toks, i + 1, Vec::new(), &mut f.uses);
            }
            Some(_) if toks.get(i + 1).map(|t| &t.tok) == Some(&Tok::Path) => {
                let preceded = i > 0 && toks[i - 1].tok == Tok::Path;
                let line = toks[i].line;
                let mut segs = Vec::new();
                while let Some(s) = toks.get(i).and_then(ident) {
                    segs.push(s.to_string());
                    if toks.get(i + 1).map(|t| &t.tok) == Some(&Tok::Path)
                        && toks.get(i + 2).and_then(ident).is_some()
                    {
                        i += 2;
                    } else {
                        i += 1;
                        break;
                    }
                }
                if !preceded {
                    f.paths.push((segs, line));
                }
            }
            _ => i += 1,
        }
    }
    Ok(f)
}

/// A module of the crate: its path from the root (empty for the root) and its file.
#[derive(Debug)]
struct Module {
    file: String,
    facts: FileFacts,
}

/// Module paths like `["dpdk", "rx"]`; the root is `[]`.
type ModPath = Vec<String>;

/// An edge `from → to` (file names relative to src/) with where it was seen.
#[derive(Debug, Clone)]
struct Edge {
    from: String,
    to: String,
    at: String,
}

struct CrateGraph {
    mods: BTreeMap<ModPath, Module>,
}

impl CrateGraph {
    /// Reads the crate whose root file is `lib.rs`; `read` loads a path relative to src/.
    fn load(read: &dyn Fn(&str) -> Option<String>) -> Result<CrateGraph, String> {
        let mut mods = BTreeMap::new();
        let mut todo: Vec<(ModPath, String)> = vec![(Vec::new(), "lib.rs".into())];
        while let Some((mp, file)) = todo.pop() {
            let src = read(&file).ok_or_else(|| format!("cannot read {file}"))?;
            let facts = facts(&src, &file)?;
            // Directory holding this module's children.
            let dir = if file == "lib.rs" || file.ends_with("/mod.rs") || file == "mod.rs" {
                Path::new(&file)
                    .parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_default()
            } else {
                PathBuf::from(file.trim_end_matches(".rs"))
            };
            for child in &facts.children {
                let flat = dir.join(format!("{child}.rs"));
                let nested = dir.join(child).join("mod.rs");
                let flat = flat.to_string_lossy().into_owned();
                let nested = nested.to_string_lossy().into_owned();
                let cf = if read(&flat).is_some() {
                    flat
                } else if read(&nested).is_some() {
                    nested
                } else {
                    return Err(format!("{file}: no file for `mod {child};`"));
                };
                let mut cp = mp.clone();
                cp.push(child.clone());
                todo.push((cp, cf));
            }
            mods.insert(mp, Module { file, facts });
        }
        Ok(CrateGraph { mods })
    }

    /// Where the path `segs`, written in module `here`, leads: the module that defines
    /// the named item (or is the named module). `None` for anything outside the crate.
    fn resolve(&self, here: &ModPath, segs: &[String], depth: usize) -> Option<ModPath> {
        if depth > 32 || segs.is_empty() {
            return None;
        }
        let (mut cur, rest) = match segs[0].as_str() {
            "crate" => (Vec::new(), &segs[1..]),
            "self" => (here.clone(), &segs[1..]),
            "super" => {
                let mut m = here.clone();
                let mut k = 0;
                while segs.get(k).map(String::as_str) == Some("super") {
                    m.pop()?;
                    k += 1;
                }
                (m, &segs[k..])
            }
            first => {
                let mut child = here.clone();
                child.push(first.to_string());
                if self.mods.contains_key(&child) {
                    (here.clone(), segs)
                } else if let Some(target) = self.alias(here, first) {
                    let mut full = target;
                    full.extend_from_slice(&segs[1..]);
                    return self.resolve(here, &full, depth + 1);
                } else {
                    return None;
                }
            }
        };
        for (k, seg) in rest.iter().enumerate() {
            let mut child = cur.clone();
            child.push(seg.clone());
            if self.mods.contains_key(&child) {
                cur = child;
                continue;
            }
            // An item of `cur`: defined there, or re-exported from elsewhere.
            if let Some(target) = self.alias(&cur, seg) {
                let mut full = target;
                full.extend_from_slice(&rest[k + 1..]);
                // A re-export of something outside the crate is defined here.
                return self.resolve(&cur, &full, depth + 1).or(Some(cur));
            }
            return Some(cur);
        }
        Some(cur)
    }

    /// The `use` path that binds `name` in module `m`, if any.
    fn alias(&self, m: &ModPath, name: &str) -> Option<Vec<String>> {
        self.mods
            .get(m)?
            .facts
            .uses
            .iter()
            .find(|u| u.alias.as_deref() == Some(name))
            .map(|u| u.path.clone())
    }

    fn edges(&self) -> Vec<Edge> {
        let mut out = Vec::new();
        for (mp, m) in &self.mods {
            let mut add = |segs: &[String], line: usize| {
                if let Some(to) = self.resolve(mp, segs, 0) {
                    let to_file = &self.mods[&to].file;
                    if *to_file != m.file {
                        out.push(Edge {
                            from: m.file.clone(),
                            to: to_file.clone(),
                            at: format!("{}:{line} `{}`", m.file, segs.join("::")),
                        });
                    }
                }
            };
            for u in &m.facts.uses {
                add(&u.path, u.line);
            }
            for (segs, line) in &m.facts.paths {
                add(segs, *line);
            }
        }
        out
    }

    /// Groups of files that import each other (strongly connected components with more
    /// than one file), each with the edges inside it.
    fn circles(&self) -> Vec<(BTreeSet<String>, Vec<Edge>)> {
        let edges = self.edges();
        let files: BTreeSet<String> = self.mods.values().map(|m| m.file.clone()).collect();
        let reach = |from: &str| -> BTreeSet<String> {
            let mut seen = BTreeSet::new();
            let mut stack = vec![from.to_string()];
            while let Some(f) = stack.pop() {
                for e in edges.iter().filter(|e| e.from == f) {
                    if seen.insert(e.to.clone()) {
                        stack.push(e.to.clone());
                    }
                }
            }
            seen
        };
        let reach: BTreeMap<String, BTreeSet<String>> =
            files.iter().map(|f| (f.clone(), reach(f))).collect();
        let mut done = BTreeSet::new();
        let mut out = Vec::new();
        for f in &files {
            if done.contains(f) || !reach[f].contains(f) {
                continue;
            }
            let scc: BTreeSet<String> = files
                .iter()
                .filter(|g| reach[f].contains(*g) && reach[*g].contains(f))
                .cloned()
                .collect();
            done.extend(scc.iter().cloned());
            let mut inside: Vec<Edge> = edges
                .iter()
                .filter(|e| scc.contains(&e.from) && scc.contains(&e.to))
                .cloned()
                .collect();
            // One witness per (from, to) pair keeps the report short.
            inside.sort_by(|a, b| (&a.from, &a.to).cmp(&(&b.from, &b.to)));
            inside.dedup_by(|a, b| a.from == b.from && a.to == b.to);
            out.push((scc, inside));
        }
        out
    }
}

fn describe(circles: &[(BTreeSet<String>, Vec<Edge>)]) -> String {
    let mut s = String::new();
    for (files, edges) in circles {
        let names: Vec<&str> = files.iter().map(String::as_str).collect();
        s.push_str(&format!("import circle among {}:\n", names.join(", ")));
        for e in edges {
            s.push_str(&format!("  {} -> {}  ({})\n", e.from, e.to, e.at));
        }
    }
    s
}

fn check_crate(name: &str) -> Result<(), String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name)
        .join("src");
    let read = |rel: &str| std::fs::read_to_string(src.join(rel)).ok();
    let g = CrateGraph::load(&read).map_err(|e| format!("{name}: {e}"))?;
    if std::env::var_os("MODCYCLES_PRINT").is_some() {
        // The graph itself, one line per file pair: `MODCYCLES_PRINT=1 cargo test -p
        // testbed --test modcycles -- --nocapture`.
        let mut pairs: BTreeMap<(String, String), String> = BTreeMap::new();
        for e in g.edges() {
            pairs.entry((e.from, e.to)).or_insert(e.at);
        }
        for ((from, to), at) in pairs {
            println!("{name}: {from} -> {to}  ({at})");
        }
    }
    let circles = g.circles();
    if circles.is_empty() {
        Ok(())
    } else {
        Err(format!("{name}:\n{}", describe(&circles)))
    }
}

#[test]
fn zbuf_and_testbed_modules_form_a_dag() {
    let errs: Vec<String> = CHECKED
        .iter()
        .filter_map(|c| check_crate(c).err())
        .collect();
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}

/// The checker itself, on small made-up crates: it must find what it is for.
mod checker {
    use super::*;

    fn graph(files: &[(&str, &str)]) -> CrateGraph {
        let map: BTreeMap<String, String> = files
            .iter()
            .map(|(p, s)| (p.to_string(), s.to_string()))
            .collect();
        CrateGraph::load(&|p: &str| map.get(p).cloned()).expect("loads")
    }

    fn circle_files(g: &CrateGraph) -> Vec<Vec<String>> {
        g.circles()
            .into_iter()
            .map(|(f, _)| f.into_iter().collect())
            .collect()
    }

    #[test]
    fn finds_a_circle_through_use_lines() {
        let g = graph(&[
            ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
            ("a.rs", "use crate::b::B;\npub struct A;\n"),
            ("b.rs", "use crate::{a::A, c};\npub struct B;\n"),
            ("c.rs", "pub struct C;\n"),
        ]);
        assert_eq!(circle_files(&g), vec![vec!["a.rs", "b.rs"]]);
    }

    #[test]
    fn follows_re_exports_and_inline_paths() {
        // b names `A` through the root's re-export, in code rather than a `use`; a names
        // b's function by a full path.
        let g = graph(&[
            ("lib.rs", "mod a;\nmod b;\npub use a::A;\n"),
            ("a.rs", "pub struct A;\nfn f() { crate::b::g() }\n"),
            ("b.rs", "pub fn g() { let _ = crate::A; }\n"),
        ]);
        assert_eq!(circle_files(&g), vec![vec!["a.rs", "b.rs"]]);
    }

    #[test]
    fn a_re_export_alone_is_no_circle() {
        // The root re-exports from a and b; b uses a through the root. A DAG.
        let g = graph(&[
            ("lib.rs", "mod a;\nmod b;\npub use a::A;\npub use b::B;\n"),
            ("a.rs", "pub struct A;\n"),
            ("b.rs", "use crate::A;\npub struct B(A);\n"),
        ]);
        assert!(g.circles().is_empty(), "{}", describe(&g.circles()));
        let e = g.edges();
        assert!(e.iter().any(|e| e.from == "b.rs" && e.to == "a.rs"));
        assert!(!e.iter().any(|e| e.to == "lib.rs"));
    }

    #[test]
    fn sees_super_self_and_nested_modules() {
        let g = graph(&[
            ("lib.rs", "mod d;\n"),
            ("d/mod.rs", "mod x;\nmod y;\npub use x::X;\npub struct E;\n"),
            ("d/x.rs", "use super::E;\npub struct X;\n"),
            ("d/y.rs", "use super::{self as d, X};\n"),
        ]);
        // d/mod.rs → x (re-export), x → d/mod.rs (E): a circle; y is outside it.
        assert_eq!(circle_files(&g), vec![vec!["d/mod.rs", "d/x.rs"]]);
        assert!(g
            .edges()
            .iter()
            .any(|e| e.from == "d/y.rs" && e.to == "d/x.rs"));
    }

    #[test]
    fn ignores_comments_strings_and_test_items() {
        let g = graph(&[
            ("lib.rs", "mod a;\nmod b;\n#[cfg(test)]\nmod tests;\n"),
            ("a.rs", "pub struct A;\n#[cfg(test)]\nmod tests {\n    use crate::b::B;\n}\n"),
            (
                "b.rs",
                "//! [`crate::a::A`]\n/// See crate::a::A.\n/* crate::a::A */\n\
                 pub struct B;\nconst S: &str = \"crate::a::A\";\nconst R: &str = r#\"crate::a::A\"#;\n\
                 fn f<'a>(x: &'a u8) -> char { let _ = x; 'c' }\n\
                 fn g() -> crate::a::A { crate::a::A }\n",
            ),
        ]);
        // Only b → a (from `g`) is real: no circle, and exactly one edge.
        assert!(g.circles().is_empty());
        let e = g.edges();
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e.iter().all(|e| e.from == "b.rs" && e.to == "a.rs"));
        assert!(e.iter().all(|e| e.at.starts_with("b.rs:8 ")), "{e:?}");
    }

    #[test]
    fn rejects_inline_modules() {
        let map: BTreeMap<String, String> =
            [("lib.rs".to_string(), "mod inner { }\n".to_string())].into();
        let r = CrateGraph::load(&|p: &str| map.get(p).cloned());
        assert!(r.is_err());
    }
}
