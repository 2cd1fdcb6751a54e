//! No import circles between the source files of zbuf and testbed (issue 14): the
//! modules of each crate form a DAG, so a walk through the code never comes back to a
//! file it left. Run with `cargo test -p testbed --test modcycles` (part of `make test`);
//! with `MODCYCLES_PRINT=1` and `-- --nocapture` it also prints every edge.
//!
//! The checker reads the sources with `syn` (no extra tool to install):
//!
//! * Nodes are source files (`lib.rs`, `x.rs`, `x/mod.rs`), found by following `mod x;`
//!   declarations from `src/lib.rs` (all features: `#[cfg(feature = ...)]` is ignored).
//!   An inline `mod x { ... }` is a module of its file.
//! * An edge `a → b` is a path in `a` that names an item *defined* in `b`: every `use`
//!   tree (`pub use` included) and every path of two or more segments in the code,
//!   macro arguments included, that starts with `crate`, `self`, `super`, a child
//!   module or a name imported there. A re-export is an alias: `crate::Zbuf` is an edge
//!   to the file that defines `Zbuf`, not to `lib.rs`.
//! * Comments and doc comments (intra-doc links are not imports), string literals and
//!   `#[cfg(test)]` items (unit test modules) are left out.
//! * Not seen: macros used by textual scope (`macro_rules!` without a path); neither
//!   crate defines one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::visit::{self, Visit};

/// Crates whose module graph must be acyclic, relative to the workspace root.
const CHECKED: &[&str] = &["zbuf", "testbed"];

/// One leaf of a `use` tree: `alias` names `path` in the importing module.
#[derive(Clone, Debug)]
struct UseLeaf {
    path: Vec<String>,
    /// `None` for a glob.
    alias: Option<String>,
    line: usize,
}

/// What one module says about modules and paths.
#[derive(Debug, Default)]
struct FileFacts {
    /// `mod x;` declarations (modules in their own file).
    children: Vec<String>,
    /// Every leaf of every `use` tree.
    uses: Vec<UseLeaf>,
    /// Paths of two or more segments outside `use` items: (segments, line).
    paths: Vec<(Vec<String>, usize)>,
}

/// `true` for `#[cfg(test)]`.
fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| match &a.meta {
        syn::Meta::List(l) => l.path.is_ident("cfg") && l.tokens.to_string() == "test",
        _ => false,
    })
}

fn item_attrs(i: &syn::Item) -> &[syn::Attribute] {
    use syn::Item::*;
    match i {
        Const(x) => &x.attrs,
        Enum(x) => &x.attrs,
        ExternCrate(x) => &x.attrs,
        Fn(x) => &x.attrs,
        ForeignMod(x) => &x.attrs,
        Impl(x) => &x.attrs,
        Macro(x) => &x.attrs,
        Mod(x) => &x.attrs,
        Static(x) => &x.attrs,
        Struct(x) => &x.attrs,
        Trait(x) => &x.attrs,
        TraitAlias(x) => &x.attrs,
        Type(x) => &x.attrs,
        Union(x) => &x.attrs,
        Use(x) => &x.attrs,
        _ => &[],
    }
}

fn impl_item_attrs(i: &syn::ImplItem) -> &[syn::Attribute] {
    match i {
        syn::ImplItem::Const(x) => &x.attrs,
        syn::ImplItem::Fn(x) => &x.attrs,
        syn::ImplItem::Type(x) => &x.attrs,
        syn::ImplItem::Macro(x) => &x.attrs,
        _ => &[],
    }
}

/// Flattens a `use` tree below `prefix`.
fn use_leaves(tree: &syn::UseTree, prefix: &mut Vec<String>, line: usize, out: &mut Vec<UseLeaf>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_leaves(&p.tree, prefix, line, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            let mut path = prefix.clone();
            if name == "self" {
                // `x::{self}` names the module `x` itself.
                out.push(UseLeaf {
                    alias: path.last().cloned(),
                    path,
                    line,
                });
            } else {
                path.push(name.clone());
                out.push(UseLeaf {
                    path,
                    alias: Some(name),
                    line,
                });
            }
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            if r.ident != "self" {
                path.push(r.ident.to_string());
            }
            out.push(UseLeaf {
                path,
                alias: Some(r.rename.to_string()),
                line,
            });
        }
        syn::UseTree::Glob(_) => out.push(UseLeaf {
            path: prefix.clone(),
            alias: None,
            line,
        }),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_leaves(t, prefix, line, out);
            }
        }
    }
}

/// Paths (`a::b::c`, two segments or more) in macro arguments, which syn leaves as tokens.
fn token_paths(ts: TokenStream, out: &mut Vec<(Vec<String>, usize)>) {
    let toks: Vec<TokenTree> = ts.into_iter().collect();
    let is_colon2 = |k: usize| {
        matches!((toks.get(k), toks.get(k + 1)),
            (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
            if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':')
    };
    let mut k = 0;
    while k < toks.len() {
        match &toks[k] {
            TokenTree::Group(g) => {
                token_paths(g.stream(), out);
                k += 1;
            }
            TokenTree::Ident(first) if !(k >= 2 && is_colon2(k - 2)) => {
                let line = first.span().start().line;
                let mut segs = vec![first.to_string()];
                let mut j = k;
                while is_colon2(j + 1) {
                    match toks.get(j + 3) {
                        Some(TokenTree::Ident(next)) => {
                            segs.push(next.to_string());
                            j += 3;
                        }
                        _ => break,
                    }
                }
                if segs.len() > 1 {
                    out.push((segs, line));
                }
                k = j + 1;
            }
            _ => k += 1,
        }
    }
}

/// Walks one file, collecting facts per module (the file's own and its inline ones).
struct Walker {
    /// The module of the file itself.
    root: ModPath,
    /// The module being walked (`root` or an inline module in it).
    here: ModPath,
    mods: BTreeMap<ModPath, FileFacts>,
    error: Option<String>,
}

impl Walker {
    fn cur(&mut self) -> &mut FileFacts {
        self.mods.entry(self.here.clone()).or_default()
    }
}

impl<'ast> Visit<'ast> for Walker {
    fn visit_item(&mut self, i: &'ast syn::Item) {
        if !is_cfg_test(item_attrs(i)) {
            visit::visit_item(self, i);
        }
    }

    fn visit_impl_item(&mut self, i: &'ast syn::ImplItem) {
        if !is_cfg_test(impl_item_attrs(i)) {
            visit::visit_impl_item(self, i);
        }
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        let name = m.ident.to_string();
        match &m.content {
            None if self.here != self.root => {
                self.error = Some(format!(
                    "`mod {name};` inside an inline module (not supported by this checker)"
                ));
            }
            None => self.cur().children.push(name),
            Some((_, items)) => {
                self.here.push(name);
                self.cur();
                for i in items {
                    self.visit_item(i);
                }
                self.here.pop();
            }
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let line = u.use_token.span.start().line;
        let mut leaves = Vec::new();
        if u.leading_colon.is_none() {
            use_leaves(&u.tree, &mut Vec::new(), line, &mut leaves);
        }
        self.cur().uses.extend(leaves);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() && p.segments.len() > 1 {
            let segs = p.segments.iter().map(|s| s.ident.to_string()).collect();
            let line = p.segments[0].ident.span().start().line;
            self.cur().paths.push((segs, line));
        }
        visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        visit::visit_macro(self, m);
        let mut found = Vec::new();
        token_paths(m.tokens.clone(), &mut found);
        self.cur().paths.extend(found);
    }
}

/// The facts of the file `src` whose module is `here`, and of its inline modules.
fn facts(src: &str, file: &str, here: &ModPath) -> Result<BTreeMap<ModPath, FileFacts>, String> {
    let ast = syn::parse_file(src).map_err(|e| {
        let at = e.span().start();
        format!("{file}:{}:{}: {e}", at.line, at.column)
    })?;
    let mut w = Walker {
        root: here.clone(),
        here: here.clone(),
        mods: BTreeMap::new(),
        error: None,
    };
    w.cur();
    w.visit_file(&ast);
    match w.error {
        Some(e) => Err(format!("{file}: {e}")),
        None => Ok(w.mods),
    }
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
            let mut in_file = facts(&src, &file, &mp)?;
            let own = in_file.remove(&mp).unwrap_or_default();
            // Directory holding this module's children.
            let dir = if file == "lib.rs" || file.ends_with("/mod.rs") || file == "mod.rs" {
                Path::new(&file)
                    .parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_default()
            } else {
                PathBuf::from(file.trim_end_matches(".rs"))
            };
            for child in &own.children {
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
            for (inline, facts) in in_file {
                mods.insert(
                    inline,
                    Module {
                        file: file.clone(),
                        facts,
                    },
                );
            }
            mods.insert(mp, Module { file, facts: own });
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
    fn inline_modules_belong_to_their_file() {
        let g = graph(&[
            (
                "lib.rs",
                "mod a;\nmod inner {\n    pub fn f() { super::a::g() }\n}\n",
            ),
            ("a.rs", "pub fn g() { crate::inner::f() }\n"),
        ]);
        assert_eq!(circle_files(&g), vec![vec!["a.rs", "lib.rs"]]);
    }

    #[test]
    fn sees_paths_in_macro_arguments() {
        let g = graph(&[
            ("lib.rs", "mod a;\nmod b;\n"),
            (
                "a.rs",
                "pub fn ok() -> bool { debug_assert!(crate::b::ok()); true }\n",
            ),
            (
                "b.rs",
                "pub fn ok() -> bool { format!(\"{}\", crate::a::ok()).is_empty() }\n",
            ),
        ]);
        assert_eq!(circle_files(&g), vec![vec!["a.rs", "b.rs"]]);
    }

    #[test]
    fn a_parse_error_is_an_error() {
        let map: BTreeMap<String, String> = [("lib.rs".to_string(), "mod a\n".to_string())].into();
        let r = CrateGraph::load(&|p: &str| map.get(p).cloned());
        assert!(r.is_err());
    }
}
