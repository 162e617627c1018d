//! The layout keeps one rule the compiler does not: no circle of `crate::` references between the
//! top-level modules of any crate of the workspace or the bench, so each module can be read (and
//! moved) after the ones it stands on. Test code (`#[cfg(test)]` modules, `*tests.rs` files) may
//! use any fixture and is not counted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each source tree checked, with its crate root file (which may name every module).
const TREES: &[(&str, &str)] = &[
    ("src", "lib.rs"),
    ("bench", "relay.rs"),
    ("crates/producer/src", "lib.rs"),
    ("crates/consumer/src", "lib.rs"),
    ("crates/devenv/src", "lib.rs"),
    ("crates/dev/src", "main.rs"),
    ("crates/outbox-relay/src", "main.rs"),
];

type Graph = BTreeMap<String, BTreeSet<String>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `text` without comments and without `#[cfg(test)]` items (a `mod x;` line or a braced block).
fn production_code(text: &str) -> String {
    let text: String = text
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        rest = &rest[at + "#[cfg(test)]".len()..];
        let block = rest.find('{');
        let line_end = rest.find(';');
        match (block, line_end) {
            (Some(open), end) if end.is_none_or(|end| open < end) => {
                let mut depth = 0;
                let mut close = rest.len();
                for (i, c) in rest[open..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                close = open + i + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                rest = &rest[close..];
            }
            (_, Some(end)) => rest = &rest[end + 1..],
            _ => rest = "",
        }
    }
    out.push_str(rest);
    out
}

/// Which top-level module references which, in one source tree.
fn module_graph(root: &Path, crate_root: &str) -> Graph {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let mut graph = Graph::new();
    for file in files {
        let relative = file.strip_prefix(root).unwrap();
        let first = relative.components().next().unwrap().as_os_str();
        let module = first.to_string_lossy().trim_end_matches(".rs").to_string();
        let name = file.file_name().unwrap().to_string_lossy();
        if relative == Path::new(crate_root) || name.ends_with("tests.rs") {
            continue;
        }
        let code = production_code(&std::fs::read_to_string(&file).unwrap());
        let uses = graph.entry(module.clone()).or_default();
        for (at, _) in code.match_indices("crate::") {
            let target: String = code[at + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !target.is_empty() && target != module {
                uses.insert(target);
            }
        }
    }
    graph
}

/// The circles of `graph` (strongly connected components of more than one module), by Tarjan.
fn circles(graph: &Graph) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in self.graph[v].iter().filter(|w| self.graph.contains_key(*w)) {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w.as_str()]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w.as_str()) {
                    let low = self.low[v].min(self.index[w.as_str()]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let at = self.stack.iter().rposition(|m| *m == v).unwrap();
                let circle: Vec<String> = self.stack.drain(at..).map(str::to_string).collect();
                if circle.len() > 1 {
                    self.found.push(circle);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for module in graph.keys() {
        if !walk.index.contains_key(module.as_str()) {
            walk.visit(module);
        }
    }
    walk.found
}

#[test]
fn no_module_references_its_way_back_to_itself() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for (tree, crate_root) in TREES {
        for circle in circles(&module_graph(&workspace.join(tree), crate_root)) {
            found.push(format!("{tree}: {}", circle.join(" <-> ")));
        }
    }
    assert!(found.is_empty(), "module circles: {found:#?}");
}

#[test]
fn a_circle_is_found_and_test_code_is_not_counted() {
    let graph: Graph = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(m, uses)| (m.to_string(), uses.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(circles(&graph), vec![vec!["a", "b", "c"]]);
    let code = "use crate::a::X;\n#[cfg(test)]\nmod tests { use crate::b::Y; fn f() { {} } }\n\
                #[cfg(test)]\nmod more;\nuse crate::c; // crate::d\n";
    let kept = production_code(code);
    assert!(
        kept.contains("crate::a") && kept.contains("crate::c"),
        "{kept}"
    );
    assert!(
        !kept.contains("crate::b") && !kept.contains("crate::d"),
        "{kept}"
    );
}
