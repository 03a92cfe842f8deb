//! The module graph of a crate, read from its source, and a check that it has no cycles (issue
//! 45): a module that imports a module that imports it back has no place in a layered reading of
//! the crate, and such circles grow unnoticed unless a test refuses them.
//!
//! A crate's modules are the files `src/*.rs` and the directories `src/*/` (a directory is one
//! module, whatever its files); the crate root (`lib.rs` or `main.rs`) is its table of contents,
//! not a node. An edge `a → b` is any path `crate::b…` in `a`'s files (in a `use` or inline, in
//! `use crate::{…}` groups too), and `super::b…` at the top level of a top-level file (where
//! `super` is the crate root). A name the root re-exports (`pub use b::Name;`) counts as `b`; a
//! name the root defines itself or takes from another crate is no edge. Comments and string
//! literals are skipped, so doc links do not count. Test code is not the crate's structure and is
//! skipped: a `#[cfg(test)]` item from there to the end of its file (the convention: tests last),
//! and a file its parent declares `#[cfg(test)] mod name;` (a test-only kind, say).
//!
//! A crate is checked by a test in it calling [`assert_acyclic`] with its manifest directory.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Modules and what each one uses, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Graph {
    pub uses: BTreeMap<String, BTreeSet<String>>,
}

/// Reads the module graph of the crate whose manifest is in `crate_dir`.
pub fn graph(crate_dir: &Path) -> Graph {
    let src = crate_dir.join("src");
    let mut files: BTreeMap<String, Vec<(PathBuf, bool)>> = BTreeMap::new();
    let mut root = None;
    for entry in fs::read_dir(&src).unwrap_or_else(|e| panic!("reading {}: {e}", src.display())) {
        let path = entry.unwrap().path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()).map(str::to_owned) else { continue };
        if path.is_dir() {
            let mut inner = Vec::new();
            rs_files(&path, &mut inner);
            files.entry(stem).or_default().extend(inner.into_iter().map(|p| (p, false)));
        } else if path.extension().is_some_and(|e| e == "rs") {
            if stem == "lib" || (stem == "main" && !src.join("lib.rs").exists()) {
                root = Some(path);
            } else {
                // A top-level file: its `super::` is the crate root.
                files.entry(stem).or_default().push((path, true));
            }
        }
    }
    let root = root.unwrap_or_else(|| panic!("{} has neither lib.rs nor main.rs", src.display()));
    let reexports = reexports(&code_only(&read(&root)), &files);
    let test_only = test_only_files(files.values().flatten().map(|(p, _)| p));
    let mut g = Graph::default();
    for (module, paths) in &files {
        let uses = g.uses.entry(module.clone()).or_default();
        for (path, top) in paths.iter().filter(|(p, _)| !test_only.contains(p)) {
            for name in referenced(&without_tests(&code_only(&read(path))), *top) {
                let target = if files.contains_key(&name) { Some(&name) } else { reexports.get(&name) };
                if let Some(t) = target.filter(|t| *t != module) {
                    uses.insert(t.clone());
                }
            }
        }
    }
    g
}

/// Panics, naming every cycle, if the module graph of the crate in `crate_dir` has one. Prints
/// the graph either way (bottom first, for docs/architecture.md; see it with `--nocapture`).
pub fn assert_acyclic(crate_dir: &Path) {
    let g = graph(crate_dir);
    println!("{}", g.render());
    let cycles = g.cycles();
    assert!(
        cycles.is_empty(),
        "the modules of {} import each other in circles (issue 45); move what the lower module needs below both:\n{}",
        crate_dir.display(),
        cycles
            .iter()
            .map(|c| format!("  {} (and all of {} reach each other)", c.join(" → "), g.group(&c[0]).join(" ")))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

impl Graph {
    /// One cycle for every group of modules that reach each other (a strongly connected
    /// component), as a path that starts and ends at the same module.
    pub fn cycles(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        for start in self.uses.keys() {
            if seen.contains(start) {
                continue;
            }
            let group: BTreeSet<&String> =
                self.reachable(start).into_iter().filter(|m| self.reachable(m).contains(start)).collect();
            seen.extend(group.iter().map(|m| (*m).clone()));
            if group.len() > 1 {
                out.push(self.cycle_through(start, &group));
            }
        }
        out
    }

    /// Modules by layer, bottom first: a module's layer is one above the highest it uses. Each
    /// line names a module and what it uses. Modules in or above a cycle have no layer: they come
    /// last, marked `?`.
    pub fn render(&self) -> String {
        let mut layer: BTreeMap<&String, usize> = BTreeMap::new();
        while let Some(m) = self.uses.iter().find_map(|(m, uses)| {
            let placed = !layer.contains_key(m) && uses.iter().all(|u| layer.contains_key(u));
            placed.then_some(m)
        }) {
            let l = self.uses[m].iter().map(|u| layer[u] + 1).max().unwrap_or(0);
            layer.insert(m, l);
        }
        let mut lines = Vec::new();
        for l in 0..=layer.values().copied().max().unwrap_or(0) {
            for (m, _) in layer.iter().filter(|(_, ml)| **ml == l) {
                let uses: Vec<&str> = self.uses[*m].iter().map(String::as_str).collect();
                lines.push(format!("{l:2} {m}: {}", uses.join(" ")));
            }
        }
        for (m, uses) in self.uses.iter().filter(|(m, _)| !layer.contains_key(m)) {
            let uses: Vec<&str> = uses.iter().map(String::as_str).collect();
            lines.push(format!(" ? {m}: {}", uses.join(" ")));
        }
        lines.join("\n")
    }

    /// The modules that reach `module` and are reached by it, itself included.
    pub fn group(&self, module: &String) -> Vec<String> {
        let mut group: BTreeSet<String> =
            self.reachable(module).into_iter().filter(|m| self.reachable(m).contains(module)).cloned().collect();
        group.insert(module.clone());
        group.into_iter().collect()
    }

    fn reachable(&self, from: &String) -> BTreeSet<&String> {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<&String> = self.uses.get(from).into_iter().flatten().collect();
        while let Some(m) = todo.pop() {
            if seen.insert(m) {
                todo.extend(self.uses.get(m).into_iter().flatten());
            }
        }
        seen
    }

    /// A shortest path from `start` back to itself inside `group`.
    fn cycle_through(&self, start: &String, group: &BTreeSet<&String>) -> Vec<String> {
        let mut came_from: BTreeMap<&String, &String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        while let Some(m) = queue.pop_front() {
            for next in self.uses.get(m).into_iter().flatten().filter(|n| group.contains(n)) {
                if next == start {
                    let mut path = vec![start.clone()];
                    let mut at = m;
                    while at != start {
                        path.push(at.clone());
                        at = came_from[at];
                    }
                    path.push(start.clone());
                    path.reverse();
                    return path;
                }
                if !came_from.contains_key(next) {
                    came_from.insert(next, m);
                    queue.push_back(next);
                }
            }
        }
        vec![start.clone()]
    }
}

/// The files declared `#[cfg(test)] mod name;` by the file beside them (or their directory's
/// `mod.rs`).
fn test_only_files<'a>(paths: impl Iterator<Item = &'a PathBuf>) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for path in paths {
        let code = code_only(&read(path));
        let lines: Vec<&str> = code.lines().map(str::trim).collect();
        for w in lines.windows(2) {
            let Some(name) = w[1].strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) else { continue };
            if w[0] == "#[cfg(test)]" {
                let dir = path.parent().unwrap_or(Path::new("."));
                // `a/mod.rs` declares `a/b.rs`; `a.rs` declares `a/b.rs`.
                let base = if path.file_stem().is_some_and(|s| s == "mod") {
                    dir.to_path_buf()
                } else {
                    dir.join(path.file_stem().unwrap_or_default())
                };
                out.insert(base.join(format!("{name}.rs")));
            }
        }
    }
    out
}

/// `code` up to its first `#[cfg(test)]` line that begins an inline module (the tests, last).
fn without_tests(code: &str) -> String {
    let lines: Vec<&str> = code.lines().collect();
    let end = lines
        .windows(2)
        .position(|w| {
            w[0].trim() == "#[cfg(test)]" && w[1].trim_start().starts_with("mod ") && w[1].trim_end().ends_with('{')
        })
        .unwrap_or(lines.len());
    lines[..end].join("\n")
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rs_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The source with comments and the contents of string and character literals blanked out
/// (lines kept), so only code is searched.
fn code_only(src: &str) -> String {
    let s: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < s.len() {
        let at = |k: usize| s.get(i + k).copied().unwrap_or('\0');
        if at(0) == '/' && at(1) == '/' {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if at(0) == '/' && at(1) == '*' {
            let mut depth = 0;
            while i < s.len() {
                if s[i] == '/' && s.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if s[i] == '*' && s.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(s[i]));
                    i += 1;
                }
            }
        } else if at(0) == 'r'
            && (at(1) == '"' || (at(1) == '#' && (at(2) == '"' || at(2) == '#')))
            && starts_word(&s, i)
        {
            // A raw string: r"…", r#"…"#, …
            let hashes = s[i + 1..].iter().take_while(|c| **c == '#').count();
            i += 2 + hashes;
            out.push('"');
            while i < s.len()
                && !(s[i] == '"' && s[i + 1..].iter().take(hashes).filter(|c| **c == '#').count() == hashes)
            {
                out.push(blank(s[i]));
                i += 1;
            }
            i += 1 + hashes;
            out.push('"');
        } else if at(0) == '"' {
            out.push('"');
            i += 1;
            while i < s.len() && s[i] != '"' {
                if s[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < s.len() {
                    out.push(blank(s[i]));
                    i += 1;
                }
            }
            i += 1;
            out.push('"');
        } else if at(0) == '\'' && (at(1) == '\\' || at(2) == '\'') {
            // A character literal (a lifetime has no closing quote right after one character).
            i += 1;
            while i < s.len() && s[i] != '\'' {
                i += if s[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(at(0));
            i += 1;
        }
    }
    out
}

/// Whether `s[i]` starts a token: no identifier character before it (but `b`, a byte string's).
fn starts_word(s: &[char], i: usize) -> bool {
    let ident = |k: usize| s.get(k).is_some_and(|c| c.is_alphanumeric() || *c == '_');
    i == 0 || !ident(i - 1) || (s[i - 1] == 'b' && (i == 1 || !ident(i - 2)))
}

fn ident_at(s: &[char], mut i: usize) -> (String, usize) {
    while i < s.len() && s[i].is_whitespace() {
        i += 1;
    }
    let start = i;
    while i < s.len() && (s[i].is_alphanumeric() || s[i] == '_') {
        i += 1;
    }
    (s[start..i].iter().collect(), i)
}

/// The first segments of the paths in a `{…}` group starting at `s[i] == '{'`.
fn group_heads(s: &[char], i: usize) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut expect = true;
    let mut k = i;
    while k < s.len() {
        match s[k] {
            '{' => {
                depth += 1;
                expect = depth == 1;
                k += 1;
            }
            '}' => {
                depth -= 1;
                k += 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => {
                expect = true;
                k += 1;
            }
            c if expect && depth == 1 && (c.is_alphanumeric() || c == '_') => {
                let (name, next) = ident_at(s, k);
                heads.push(name);
                expect = false;
                k = next;
            }
            _ => k += 1,
        }
    }
    heads
}

/// Every name `crate::NAME` (and `super::NAME` at the top level if `top`) refers to in `code`.
fn referenced(code: &str, top: bool) -> BTreeSet<String> {
    let s: Vec<char> = code.chars().collect();
    let mut names = BTreeSet::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        let word_start = i == 0 || !(s[i - 1].is_alphanumeric() || s[i - 1] == '_');
        let prefix = ["crate::", "super::"].into_iter().find(|p| s[i..].starts_with(&p.chars().collect::<Vec<_>>()));
        match prefix {
            Some(p) if word_start && (p == "crate::" || (top && depth == 0)) => {
                let mut k = i + p.len();
                while k < s.len() && s[k].is_whitespace() {
                    k += 1;
                }
                if s.get(k) == Some(&'{') {
                    names.extend(group_heads(&s, k));
                } else {
                    let (name, _) = ident_at(&s, k);
                    names.insert(name);
                }
                i += p.len();
            }
            _ => i += 1,
        }
    }
    names.remove("");
    names.remove("self");
    names
}

/// What the crate root re-exports from its own modules (`pub use module::{Name, …};`): each
/// name, with the module it comes from.
fn reexports(root: &str, modules: &BTreeMap<String, Vec<(PathBuf, bool)>>) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for stmt in root.split(';') {
        let stmt = stmt.trim();
        let Some(at) = stmt.find("use ") else { continue };
        if !stmt[..at].trim_start().starts_with("pub") {
            continue;
        }
        let path = stmt[at + 4..].trim();
        let path = path.strip_prefix("crate::").or_else(|| path.strip_prefix("self::")).unwrap_or(path);
        let chars: Vec<char> = path.chars().collect();
        let (module, next) = ident_at(&chars, 0);
        if !modules.contains_key(&module) {
            continue;
        }
        let rest: String = chars[next..].iter().collect();
        let rest = rest.trim_start_matches("::").trim();
        // The name a path ends in (or its `as` alias), for each path of a group.
        let last = |p: &str| p.rsplit(" as ").next().unwrap_or(p).rsplit("::").next().unwrap_or(p).trim().to_owned();
        let names: Vec<String> = match rest.rfind('{') {
            Some(open) => rest[open + 1..].trim_end_matches('}').split(',').map(last).collect(),
            None => vec![last(rest)],
        };
        for name in names.into_iter().filter(|n| !n.is_empty() && n != "*" && n != "self") {
            map.insert(name, module.clone());
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph_of(files: &[(&str, &str)]) -> Graph {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            let path = dir.path().join("src").join(name);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }
        graph(dir.path())
    }

    #[test]
    fn paths_groups_reexports_and_super_are_edges_comments_and_strings_are_not() {
        let g = graph_of(&[
            ("lib.rs", "mod a; mod b; mod c; mod d;\npub use b::{Thing, Other as Alias};\npub use d::Deep;"),
            (
                "a.rs",
                "use crate::{Thing, c::{self, X}};\n/// [`crate::d`]\nfn f() { let s = \"crate::d\"; let c = '{'; }",
            ),
            ("b.rs", "fn g() -> crate::Alias { todo!() }\nmod tests { use super::*; }"),
            ("c.rs", "use super::Deep;\nfn h<'a>(x: &'a str) {}"),
            ("d/mod.rs", "mod inner;"),
            ("d/inner.rs", "use super::Deep; use crate::d::Deep as D;"),
        ]);
        let uses = |m: &str| g.uses[m].iter().map(String::as_str).collect::<Vec<_>>();
        assert_eq!(uses("a"), ["b", "c"]);
        assert_eq!(uses("b"), Vec::<&str>::new());
        assert_eq!(uses("c"), ["d"]);
        assert_eq!(uses("d"), Vec::<&str>::new());
        assert!(g.cycles().is_empty());
        assert_eq!(g.render(), " 0 b: \n 0 d: \n 1 c: d\n 2 a: b c");
    }

    #[test]
    fn a_cycle_is_named() {
        let g = graph_of(&[
            ("lib.rs", "mod a; mod b; mod c; mod d;"),
            ("a.rs", "use crate::b::X;"),
            ("b.rs", "use crate::c::Y;"),
            ("c.rs", "fn f() { crate::a::z(); crate::d::w(); }"),
            ("d.rs", ""),
        ]);
        assert_eq!(g.cycles(), vec![vec!["a", "b", "c", "a"]]);
        assert_eq!(g.render(), " 0 d: \n ? a: b\n ? b: c\n ? c: a d");
    }
}
