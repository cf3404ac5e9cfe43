//! The layering rule, in its one home: which module of each crate may
//! import which. Rust accepts a cycle inside a crate, so this test is the
//! only guard of these directions; the crates' own boundaries (ingest never
//! uses worker nor operator, nor the reverse; operator never uses worker)
//! are the compiler's, since none lists the other as a dependency. `scripts/check-layers.sh` (run by CI) runs
//! this test, and the `lib.rs` maps and `docs/architecture.md` cite it.
//!
//! It reads every `crate::` path (and `super::` at a crate's top level) in
//! the code of each crate's modules, above any `#[cfg(test)]` module and
//! outside comments, and fails on an edge its table does not list, naming
//! every one. A module missing from its crate's table fails too.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// One crate's table: each top-level module and the modules of the same
/// crate it may import.
struct Table {
    /// The crate's folder in the workspace.
    dir: &'static str,
    modules: &'static [(&'static str, &'static [&'static str])],
}

/// `shared` (crate `hookinbox`), bottom to top. A module may import only
/// from the layers below it.
const SHARED: Table = Table {
    dir: "shared",
    modules: &[
        // 0 nouns: nothing of this crate.
        ("key", &[]),
        ("signature", &[]),
        ("payload", &[]),
        ("client", &[]),
        ("metrics", &[]),
        ("telemetry", &[]),
        ("shutdown", &[]),
        ("failpoints", &[]),
        // 1 message.
        ("job", &["key"]),
        // 1 policy: the egress policy reads CIDR lists as the trusted
        // proxies do.
        ("egress", &["client"]),
        // 1 adapter.
        ("postgres", &[]),
        // 2 state machine.
        ("deliveries", &["key", "job", "postgres"]),
        // 3 policy.
        ("retry", &["deliveries"]),
        // 3 adapter.
        ("broker", &["key", "job", "deliveries"]),
        // 4 settings: everything above.
        (
            "config",
            &[
                "key",
                "signature",
                "payload",
                "client",
                "metrics",
                "telemetry",
                "shutdown",
                "failpoints",
                "egress",
                "job",
                "postgres",
                "deliveries",
                "retry",
                "broker",
            ],
        ),
        // 4 entry: how both binaries start.
        ("cli", &["metrics", "telemetry", "failpoints"]),
    ],
};

/// `ingest` (crate `hookinbox-ingest`): `cli → startup → receive →
/// {admission, allow, answer, body, rotation, limits}`.
const INGEST: Table = Table {
    dir: "ingest",
    modules: &[
        ("cli", &["startup"]),
        ("startup", &["receive", "rotation", "limits", "admission"]),
        (
            "receive",
            &["admission", "allow", "answer", "body", "rotation", "limits"],
        ),
        ("allow", &["answer"]),
        ("limits", &["answer"]),
        ("admission", &["answer"]),
        ("answer", &[]),
        ("body", &["admission", "answer"]),
        ("rotation", &[]),
    ],
};

/// `operator` (crate `hookinbox-operator`): the core below, the two faces
/// above it, neither using the other.
const OPERATOR: Table = Table {
    dir: "operator",
    modules: &[
        (
            "cli",
            &["age", "dlq", "view", "actor", "jobs", "destinations"],
        ),
        (
            "console",
            &[
                "age",
                "dlq",
                "view",
                "actor",
                "jobs",
                "audit",
                "destinations",
            ],
        ),
        ("jobs", &["actor", "audit", "replay", "dlq"]),
        ("destinations", &["actor", "audit"]),
        ("audit", &["actor"]),
        ("replay", &[]),
        ("view", &[]),
        ("actor", &[]),
        ("age", &[]),
        ("dlq", &[]),
    ],
};

/// `worker` (crate `hookinbox-worker`); the operator's commands come from
/// `hookinbox-operator`, wired by `cli` only.
const WORKER: Table = Table {
    dir: "worker",
    modules: &[
        ("cli", &["runtime", "handlers", "reconcile", "maintenance"]),
        (
            "runtime",
            &["handlers", "maintenance", "reconcile", "context"],
        ),
        ("maintenance", &["context"]),
        ("handlers", &["resolve"]),
        ("reconcile", &["resolve"]),
        ("resolve", &[]),
        ("context", &[]),
    ],
};

const TABLES: [&Table; 4] = [&SHARED, &INGEST, &OPERATOR, &WORKER];

/// The workspace's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_owned()
}

/// Every `.rs` file under `dir`, sorted.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(dir) = todo.pop() {
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The file's code: its lines above its test module, without comments.
fn code(text: &str) -> String {
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        if line.trim_start().starts_with("//") {
            continue;
        }
        // A trailing comment, unless the `//` may sit inside a string.
        let line = match line.split_once("//") {
            Some((before, _)) if !before.contains('"') => before,
            _ => line,
        };
        lines.push(line);
    }
    lines.join("\n")
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '$'
}

/// The word that starts `text`.
fn word(text: &str) -> &str {
    let end = text.find(|c: char| !is_word(c)).unwrap_or(text.len());
    &text[..end]
}

/// The first segment of every path that follows `prefix` (`crate::` or
/// `super::`) in `text`, through `prefix{a, b::c}` groups too.
fn first_segments(text: &str, prefix: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find(prefix) {
        let start = from + at;
        from = start + prefix.len();
        if text[..start].chars().next_back().is_some_and(is_word) {
            continue; // `my_crate::`, `$crate::`
        }
        let rest = &text[from..];
        let Some(group) = rest.strip_prefix('{') else {
            names.push(word(rest).to_owned());
            continue;
        };
        // The top-level items of the group: split on the commas at depth 1.
        let (mut depth, mut item) = (1, String::new());
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            if depth == 0 || (depth == 1 && c == ',') {
                names.push(word(item.trim()).to_owned());
                item.clear();
                if depth == 0 {
                    break;
                }
            } else {
                item.push(c);
            }
        }
    }
    names.retain(|n| !n.is_empty() && n != "self");
    names
}

/// Every edge of the crate under `src` that `table` does not list, and
/// every module it does not know.
fn bad_edges(src: &Path, table: &Table) -> Vec<String> {
    let allowed = |module: &str| table.modules.iter().find(|(m, _)| *m == module);
    let mut bad = Vec::new();
    for path in sources(src) {
        let rel = path.strip_prefix(src).expect("under src");
        let parts: Vec<&str> = rel.iter().filter_map(|p| p.to_str()).collect();
        if parts.len() == 1 && matches!(parts[0], "lib.rs" | "main.rs") {
            continue;
        }
        let module = parts[0].trim_end_matches(".rs");
        let shown = format!("{}/src/{}", table.dir, parts.join("/"));
        let Some((_, may)) = allowed(module) else {
            bad.push(format!(
                "{shown}: module '{module}' is not in the table of {}; add it to tests/tests/layers.rs",
                table.dir
            ));
            continue;
        };
        let text = code(&std::fs::read_to_string(&path).expect("readable source"));
        let mut used = first_segments(&text, "crate::");
        // At a crate's top level (src/x.rs, src/x/mod.rs) `super::` is the crate.
        if parts.len() == 1 || (parts.len() == 2 && parts[1] == "mod.rs") {
            used.extend(first_segments(&text, "super::"));
        }
        let used: BTreeSet<String> = used.into_iter().collect();
        for target in used {
            // Itself, or an item the crate's root re-exports.
            if target == module || allowed(&target).is_none() {
                continue;
            }
            if !may.contains(&target.as_str()) {
                bad.push(format!(
                    "{shown}: {}::{module} may not import {}::{target}",
                    table.dir, table.dir
                ));
            }
        }
    }
    bad
}

/// The files of `shared/src/deliveries/` and the siblings each imports:
/// through `super::file::…`, or through a name `mod.rs` re-exports from
/// `file` (`super::Delivery` is `delivery.rs`'s).
fn deliveries_file_edges(dir: &Path) -> Vec<(String, String)> {
    let stem = |p: &Path| {
        p.file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_owned()
    };
    let files: Vec<PathBuf> = sources(dir)
        .into_iter()
        .filter(|p| p.parent() == Some(dir) && stem(p) != "mod")
        .collect();
    let names: BTreeSet<String> = files.iter().map(|p| stem(p)).collect();
    // `pub use file::{A, B as C};` in mod.rs: each name to its file.
    let map = code(&std::fs::read_to_string(dir.join("mod.rs")).expect("mod.rs"));
    let mut exported = std::collections::BTreeMap::new();
    for statement in map.split(';') {
        let Some(rest) = statement.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((file, items)) = rest.split_once("::") else {
            continue;
        };
        let items = items.trim().trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',') {
            let name = item.rsplit(" as ").next().unwrap_or_default().trim();
            if !name.is_empty() {
                exported.insert(name.to_owned(), file.trim().to_owned());
            }
        }
    }
    let mut edges = Vec::new();
    for path in &files {
        let from = stem(path);
        let text = code(&std::fs::read_to_string(path).expect("readable source"));
        for first in first_segments(&text, "super::") {
            let to = if names.contains(&first) {
                Some(first)
            } else {
                exported.get(&first).cloned()
            };
            if let Some(to) = to.filter(|to| *to != from) {
                edges.push((from.clone(), to));
            }
        }
    }
    edges.sort();
    edges.dedup();
    edges
}

/// A cycle among `edges`, as the files around it, if there is one.
fn a_cycle(edges: &[(String, String)]) -> Option<Vec<String>> {
    fn visit(
        at: &str,
        edges: &[(String, String)],
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == at) {
            let mut cycle = path[i..].to_vec();
            cycle.push(at.to_owned());
            return Some(cycle);
        }
        if done.contains(at) {
            return None;
        }
        path.push(at.to_owned());
        for (_, to) in edges.iter().filter(|(from, _)| from == at) {
            if let Some(cycle) = visit(to, edges, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(at.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .iter()
        .find_map(|(from, _)| visit(from, edges, &mut Vec::new(), &mut done))
}

#[test]
fn the_files_of_the_state_machine_import_each_other_without_a_cycle() {
    let edges = deliveries_file_edges(&root().join("shared/src/deliveries"));
    assert!(
        edges
            .iter()
            .any(|(from, to)| from == "filter" && to == "delivery"),
        "the edges are read: {edges:?}"
    );
    if let Some(cycle) = a_cycle(&edges) {
        panic!(
            "shared/src/deliveries/ has a file cycle: {}",
            cycle.join(" -> ")
        );
    }
    let planted = [
        ("admin".to_owned(), "filter".to_owned()),
        ("filter".to_owned(), "admin".to_owned()),
    ];
    assert!(a_cycle(&planted).is_some(), "a planted cycle is found");
}

#[test]
fn every_import_inside_a_crate_follows_its_layering_table() {
    let root = root();
    let bad: Vec<String> = TABLES
        .iter()
        .flat_map(|table| bad_edges(&root.join(table.dir).join("src"), table))
        .collect();
    assert!(
        bad.is_empty(),
        "import edges the layout does not allow:\n  {}",
        bad.join("\n  ")
    );
}

#[test]
fn a_planted_bad_edge_is_reported_and_comments_and_tests_are_not_read() {
    let dir = std::env::temp_dir().join(format!("hookinbox-layers-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("deliveries")).expect("dir");
    // Layer 2 reaching up to layer 3, through a group and a `super::` path.
    std::fs::write(
        src.join("deliveries/mod.rs"),
        "use crate::{key::DeliveryKey, broker::{Publisher}};\n\
         use super::retry::RetryPolicy; // crate::config in a comment\n\
         // use crate::config::Everything;\n\
         #[cfg(test)]\nmod tests { use crate::config::X; }\n",
    )
    .expect("write");
    std::fs::write(src.join("lib.rs"), "pub mod deliveries;\n").expect("write");
    std::fs::write(src.join("unlisted.rs"), "").expect("write");
    let table = Table {
        dir: "planted",
        modules: SHARED.modules,
    };
    let bad = bad_edges(&src, &table);
    let _ = std::fs::remove_dir_all(&dir);
    let said = bad.join("\n");
    assert!(
        said.contains("planted::deliveries may not import planted::broker"),
        "{said}"
    );
    assert!(
        said.contains("planted::deliveries may not import planted::retry"),
        "{said}"
    );
    assert!(
        said.contains("module 'unlisted' is not in the table of planted"),
        "{said}"
    );
    assert!(
        !said.contains("config"),
        "comments and tests are not read: {said}"
    );
    assert_eq!(bad.len(), 3, "{said}");
}
