//! The workspace's layers only import downwards (docs/ARCHITECTURE.md,
//! "Layers"). Reads every crate's `src/` as text, takes the `use` lines and
//! the `crate::`, `super::` and child-module paths of the code outside
//! `#[cfg(test)]`, each to the file that defines the name (through the
//! `pub use` lines that hand it on; a `pub use` alone is no import), and
//! fails naming the loop when files import each other round, directly or
//! through others. It looks at every folder with each of its files and each
//! of its subfolders as one piece (`x.rs` beside `x/` is that folder's own
//! file), so `channel/` may use `transport/`, never the other way round, and
//! `channel/mod.rs` may build every channel only because no channel imports
//! it. No channel's folder imports another channel's.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A module path (`["channel", "apns"]`) and the file that holds it.
type Modules = BTreeMap<Vec<String>, PathBuf>;
/// (module, name) -> the path a `pub use` in that module hands the name on from.
type Reexports = BTreeMap<(Vec<String>, String), Vec<String>>;
/// File -> files it imports (paths relative to the crate's `src/`).
type Graph = BTreeMap<String, BTreeSet<String>>;

const CRATES: &[&str] = &["api", "client", "engine", "loadtest", "proto", "testkit"];
/// Loops known and not yet opened, each as the folder and the pieces of it
/// that reach each other (none now). A loop that grows, or any other, fails;
/// one that is gone must leave here.
const KNOWN: &[(&str, &[&str])] = &[];
/// Folders whose subfolders are channels: none imports another.
const CHANNELS: &str = "engine/src/channel";

/// The engine's layers, bottom first, each a name and its pieces of
/// `engine/src` (a folder as `x/`, with `x.rs` beside it). A piece imports
/// pieces of its own layer or below, never above (docs/ARCHITECTURE.md,
/// "Layers"); a new piece must be given its layer here.
const ENGINE_LAYERS: &[(&str, &[&str])] = &[
    ("the domain", &["domain/", "duration.rs", "ticker.rs"]),
    ("metrics, pages and supervision", &["metrics.rs", "page.rs", "supervision.rs"]),
    ("transport", &["transport/"]),
    ("storage", &["store/"]),
    ("channels", &["channel/"]),
    (
        "the roles",
        &[
            "cluster_status.rs",
            "shard_owners.rs",
            "stale_marks.rs",
            "registry.rs",
            "ownership.rs",
            "gateway/",
            "relay_ingress/",
            "delivery/",
            "ingest.rs",
            "retention.rs",
            "testing.rs",
        ],
    ),
    ("dispatch", &["dispatch/"]),
    ("the engine", &["settings.rs", "supervisor.rs", "engine.rs", "lib.rs"]),
];

#[test]
fn the_engine_imports_only_its_own_layer_or_below() {
    let graph = graph(&workspace().join("engine/src"));
    let faults = layer_faults(&rooms(&graph, ""), ENGINE_LAYERS);
    assert!(faults.is_empty(), "engine/src against ENGINE_LAYERS:\n{}", faults.join("\n"));
}

/// Each arrow between `rooms` that runs to a layer above its own, and each
/// room no layer names.
fn layer_faults(rooms: &Graph, layers: &[(&str, &[&str])]) -> Vec<String> {
    let layer = |room: &str| layers.iter().position(|(_, pieces)| pieces.contains(&room));
    let mut faults = Vec::new();
    let all: BTreeSet<&String> = rooms.keys().chain(rooms.values().flatten()).collect();
    for room in all.iter().filter(|r| layer(r).is_none()) {
        faults.push(format!("{room} has no layer: give it one"));
    }
    for (from, tos) in rooms {
        for to in tos {
            if let (Some(a), Some(b)) = (layer(from), layer(to))
                && b > a
            {
                faults.push(format!("{from} ({}) imports {to} ({}), a layer above", layers[a].0, layers[b].0));
            }
        }
    }
    faults
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let mut faults = Vec::new();
    let mut known: Vec<(&str, &[&str])> = KNOWN.to_vec();
    for name in CRATES {
        let src = workspace().join(name).join("src");
        let graph = graph(&src);
        for level in levels(&graph) {
            let folder = format!("{name}/src/{level}").trim_end_matches('/').to_string();
            for (group, cycle) in cycles(&rooms(&graph, &level)) {
                let is_known =
                    |(f, g): &(&str, &[&str])| *f == folder && g.iter().copied().eq(group.iter().map(String::as_str));
                match known.iter().position(is_known) {
                    Some(at) => drop(known.remove(at)),
                    None => faults.push(format!("{folder}: {}", cycle.join(" -> "))),
                }
            }
        }
        for (from, tos) in &graph {
            for to in tos {
                let (a, b) = (channel_of(name, from), channel_of(name, to));
                if a.is_some() && b.is_some() && a != b {
                    faults.push(format!("{name}/src: channel {from} imports channel {to}"));
                }
            }
        }
    }
    for (folder, group) in known {
        faults.push(format!("{folder}: {group:?} no longer import each other round: take them out of KNOWN"));
    }
    assert!(faults.is_empty(), "imports that run back up:\n{}", faults.join("\n"));
}

#[test]
fn the_guard_sees_a_cycle_and_a_channel_using_another() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path();
    let write = |path: &str, text: &str| {
        let path = tree.join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    };
    write("lib.rs", "pub mod a;\npub mod b;\n");
    write("a.rs", "use crate::b::{B, C};\n#[cfg(test)]\nmod tests {\n    use crate::lib_only;\n}\n");
    write("b/mod.rs", "mod c;\npub use c::C;\npub struct B;\n");
    write("b/c.rs", "pub struct C;\nfn f() { crate::a::g(); }\n");
    let graph = graph(tree);
    assert_eq!(graph["a.rs"], BTreeSet::from(["b/mod.rs".to_string(), "b/c.rs".into()]));
    assert!(graph["b/mod.rs"].is_empty(), "a pub use alone hands a name on");
    assert_eq!(graph["b/c.rs"], BTreeSet::from(["a.rs".to_string()]));
    let (group, cycle) = cycles(&rooms(&graph, "")).pop().unwrap();
    assert_eq!((group.len(), cycle), (2, vec!["a.rs".to_string(), "b/".into(), "a.rs".into()]));
    assert!(cycles(&rooms(&graph, "b")).is_empty());
    assert_eq!(channel_of("engine", "channel/apns/mod.rs"), Some("apns"));
    assert_eq!(channel_of("engine", "channel/provider.rs"), None);
    // a imports b: b may be a's layer or below, not above; c has no layer.
    let layers: &[(&str, &[&str])] = &[("low", &["b/"]), ("high", &["a.rs", "lib.rs"])];
    assert!(
        layer_faults(&rooms(&graph, ""), layers).iter().any(|f| f == "b/ (low) imports a.rs (high), a layer above")
    );
    let layers: &[(&str, &[&str])] = &[("low", &["a.rs"]), ("high", &["b/", "lib.rs"])];
    let faults = layer_faults(&rooms(&graph, ""), layers);
    assert_eq!(faults, ["a.rs (low) imports b/ (high), a layer above"]);
    assert_eq!(layer_faults(&rooms(&graph, ""), &[("all", &["a.rs"])]), ["b/ has no layer: give it one"]);
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The channel folder a file lies in, if any.
fn channel_of<'a>(krate: &str, file: &'a str) -> Option<&'a str> {
    let prefix = CHANNELS.strip_prefix(krate)?.strip_prefix("/src/")?;
    let rest = file.strip_prefix(prefix)?.strip_prefix('/')?;
    rest.split_once('/').map(|(folder, _)| folder)
}

/// Every folder of the graph's files ("" for `src/` itself).
fn levels(graph: &Graph) -> BTreeSet<String> {
    let mut levels = BTreeSet::from([String::new()]);
    for file in graph.keys() {
        let mut dir = Path::new(file).parent();
        while let Some(d) = dir.filter(|d| !d.as_os_str().is_empty()) {
            levels.insert(d.to_string_lossy().into_owned());
            dir = d.parent();
        }
    }
    levels
}

/// The graph between the pieces of one folder: its own files, and each
/// subfolder as one piece (`"b/"`). Arrows inside a piece are dropped.
fn rooms(graph: &Graph, level: &str) -> Graph {
    let folders: BTreeSet<String> = levels(graph).into_iter().map(|l| format!("/{l}")).collect();
    let room = |file: &str| -> Option<String> {
        // `x.rs` is folder `x/`'s own file, as `x/mod.rs` would be.
        if file.strip_suffix(".rs") == Some(level) {
            return Some(file.rsplit('/').next()?.to_string());
        }
        let rest = if level.is_empty() { file } else { file.strip_prefix(level)?.strip_prefix('/')? };
        Some(match rest.split_once('/') {
            Some((folder, _)) => format!("{folder}/"),
            // `x.rs` beside `x/` is that folder's own file.
            None => match rest
                .strip_suffix(".rs")
                .filter(|x| folders.contains(&format!("/{}", Path::new(level).join(x).display())))
            {
                Some(x) => format!("{x}/"),
                None => rest.to_string(),
            },
        })
    };
    let mut rooms = Graph::new();
    for (from, tos) in graph {
        let Some(a) = room(from) else { continue };
        for b in tos.iter().filter_map(|to| room(to)) {
            if a != b {
                rooms.entry(a.clone()).or_default().insert(b);
            }
        }
    }
    rooms
}

/// Each group of nodes that reach each other, with one loop through it.
fn cycles(graph: &Graph) -> Vec<(BTreeSet<String>, Vec<String>)> {
    let reach = |from: &str| {
        let (mut seen, mut todo) = (BTreeSet::new(), vec![from.to_string()]);
        while let Some(n) = todo.pop() {
            for m in graph.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    todo.push(m.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> = graph.keys().map(|n| (n, reach(n))).collect();
    let mut groups = BTreeSet::new();
    for (n, seen) in &reached {
        let group: BTreeSet<String> =
            seen.iter().filter(|m| reached.get(m).is_some_and(|r| r.contains(*n))).cloned().collect();
        if !group.is_empty() {
            groups.insert(group);
        }
    }
    groups
        .into_iter()
        .filter_map(|group| {
            let inside: Graph = group
                .iter()
                .map(|n| (n.clone(), graph[n].iter().filter(|m| group.contains(*m)).cloned().collect()))
                .collect();
            cycle(&inside).map(|cycle| (group, cycle))
        })
        .collect()
}

/// One loop of the graph, first node repeated at its end.
fn cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit<'a>(
        node: &'a str,
        graph: &'a Graph,
        done: &mut BTreeSet<&'a str>,
        path: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| *n == node) {
            let mut cycle: Vec<String> = path[at..].iter().map(|n| n.to_string()).collect();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if !done.insert(node) {
            return None;
        }
        path.push(node);
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, done, path) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

/// Every file of `src` with the files its code imports.
fn graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    walk(src, &mut files);
    let mut modules = Modules::new();
    for file in &files {
        modules.insert(module_of(src, file), file.clone());
    }
    let mut test_only = BTreeSet::new();
    let mut code = BTreeMap::new();
    for (module, file) in &modules {
        let (text, tests) = without_tests(&fs::read_to_string(file).unwrap());
        for name in tests {
            test_only.insert([module.clone(), vec![name]].concat());
        }
        code.insert(module.clone(), text);
    }
    let mut reexports = Reexports::new();
    for (module, text) in &code {
        for (path, alias) in paths(text).into_iter().filter_map(|u| u.public) {
            reexports.insert((module.clone(), alias), path);
        }
    }
    let rel = |file: &Path| file.strip_prefix(src).unwrap().to_string_lossy().replace('\\', "/");
    let mut graph = Graph::new();
    for (module, text) in &code {
        if test_only.iter().any(|t| module.starts_with(t)) {
            continue;
        }
        let from = rel(&modules[module]);
        let imports = graph.entry(from.clone()).or_default();
        // A `pub use` only hands a name on, unless the module uses the name too.
        let words = outside_use_and_mod(tokens(text));
        let used = |name: &str| words.iter().any(|w| w == name);
        for path in paths(text).into_iter().filter(|p| p.public.as_ref().is_none_or(|(_, n)| used(n))) {
            if let Some(target) = resolve(module, &path.path, &modules, &reexports, 0) {
                let to = rel(&modules[&target]);
                if to != from {
                    imports.insert(to);
                }
            }
        }
    }
    graph
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut module: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
    if matches!(module.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        module.pop();
    }
    module
}

/// The code without comments and without its `#[cfg(test)]` items, and the
/// names of the modules those items declare by `mod name;`.
fn without_tests(text: &str) -> (String, Vec<String>) {
    let lines: Vec<&str> = text.lines().map(|l| l.split("//").next().unwrap()).collect();
    let (mut out, mut tests, mut i) = (String::new(), Vec::new(), 0);
    while i < lines.len() {
        if lines[i].trim() != "#[cfg(test)]" {
            out.push_str(lines[i]);
            out.push('\n');
            i += 1;
            continue;
        }
        i += 1;
        while i < lines.len() && lines[i].trim_start().starts_with("#[") {
            i += 1;
        }
        let mut depth = 0i32;
        while i < lines.len() {
            let line = lines[i];
            if let Some(name) = line.trim().strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                tests.push(name.trim().to_string());
            }
            depth += line.matches('{').count() as i32 - line.matches('}').count() as i32;
            i += 1;
            if depth <= 0 && (line.contains('}') || line.trim_end().ends_with(';')) {
                break;
            }
        }
    }
    (out, tests)
}

/// A path the code names; for a `pub use` leaf, also the name it hands on.
struct Named {
    path: Vec<String>,
    public: Option<(Vec<String>, String)>,
}

/// Every path the code names: the leaves of its `use` trees, and the
/// `a::b::c` paths elsewhere.
fn paths(text: &str) -> Vec<Named> {
    let tokens = tokens(text);
    let mut paths = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] == "use" {
            let public = tokens[..i].last().is_some_and(|t| t == "pub" || t == ")");
            let end = (i..tokens.len()).find(|&j| tokens[j] == ";").unwrap_or(tokens.len());
            let mut leaves = Vec::new();
            use_tree(&tokens[i + 1..end], &[], &mut leaves);
            for (path, name) in leaves {
                let public = (public && name.as_deref().is_some_and(is_ident)).then(|| (path.clone(), name.unwrap()));
                paths.push(Named { path, public });
            }
            i = end;
        } else if is_ident(&tokens[i]) && tokens.get(i + 1).is_some_and(|t| t == "::") {
            let mut path = vec![tokens[i].clone()];
            let mut j = i + 1;
            while tokens.get(j).is_some_and(|t| t == "::") && tokens.get(j + 1).is_some_and(|t| is_ident(t)) {
                path.push(tokens[j + 1].clone());
                j += 2;
            }
            paths.push(Named { path, public: None });
            i = j;
        } else {
            i += 1;
        }
    }
    paths
}

/// The leaves of a `use` tree, each with the name it binds (`None` for a glob).
fn use_tree(tokens: &[String], prefix: &[String], out: &mut Vec<(Vec<String>, Option<String>)>) {
    let mut path = prefix.to_vec();
    let mut name = None;
    let mut i = 0;
    while i < tokens.len() {
        match tokens[i].as_str() {
            "::" => {}
            "{" => {
                let (mut depth, mut start) = (0, i + 1);
                for j in i..tokens.len() {
                    match tokens[j].as_str() {
                        "{" => depth += 1,
                        "}" => depth -= 1,
                        "," if depth == 1 => {
                            use_tree(&tokens[start..j], &path, out);
                            start = j + 1;
                        }
                        _ => {}
                    }
                    if depth == 0 {
                        use_tree(&tokens[start..j], &path, out);
                        break;
                    }
                }
                return;
            }
            "as" => {
                name = tokens.get(i + 1).cloned();
                break;
            }
            "*" => break,
            t => {
                path.push(t.to_string());
                name = Some(t.to_string());
            }
        }
        i += 1;
    }
    if path.len() > prefix.len() {
        let name = if tokens.last().is_some_and(|t| t == "*") { None } else { name };
        let name = name.filter(|n| n != "self").or_else(|| path.iter().rev().find(|s| *s != "self").cloned());
        out.push((path, name));
    }
}

/// The tokens without the `use ...;` and `mod name;` items.
fn outside_use_and_mod(tokens: Vec<String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let is_mod = tokens[i] == "mod" && tokens.get(i + 2).is_some_and(|t| t == ";");
        if tokens[i] == "use" || is_mod {
            i = (i..tokens.len()).find(|&j| tokens[j] == ";").map_or(tokens.len(), |j| j + 1);
        } else {
            out.push(tokens[i].clone());
            i += 1;
        }
    }
    out
}

fn is_ident(t: &str) -> bool {
    t.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Identifiers, `::`, and single punctuation; string and char literals dropped.
fn tokens(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            tokens.push(chars[start..i].iter().collect());
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            tokens.push("::".into());
            i += 2;
        } else if !c.is_whitespace() {
            tokens.push(c.to_string());
            i += 1;
        } else {
            i += 1;
        }
    }
    tokens
}

/// The module a path names from `module`, if it is one of the crate's: the
/// module that defines the name, through the `pub use` lines that hand it on.
fn resolve(
    module: &[String],
    path: &[String],
    modules: &Modules,
    reexports: &Reexports,
    depth: usize,
) -> Option<Vec<String>> {
    let mut base: Vec<String> = module.to_vec();
    let mut rest = path;
    match rest.first()?.as_str() {
        "crate" => {
            base.clear();
            rest = &rest[1..];
        }
        "self" => rest = &rest[1..],
        "super" => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        first => {
            let child = [module, &[first.to_string()]].concat();
            if !modules.contains_key(&child) {
                return None;
            }
        }
    }
    let mut found = base;
    let mut rest = rest.iter();
    let next = loop {
        let Some(segment) = rest.next() else { break None };
        let deeper = [found.clone(), vec![segment.clone()]].concat();
        if !modules.contains_key(&deeper) {
            break Some(segment);
        }
        found = deeper;
    };
    if let Some(name) = next {
        if let Some(from) = reexports.get(&(found.clone(), name.clone())) {
            if depth < 8 && from.as_slice() != path {
                let onward = [from.clone(), rest.cloned().collect()].concat();
                if let Some(target) = resolve(&found, &onward, modules, reexports, depth + 1) {
                    return Some(target);
                }
            }
        }
    }
    modules.contains_key(&found).then_some(found)
}
