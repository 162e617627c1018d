//! The user docs cannot drift from the code: tests that read the pages beside the code they
//! describe (each kind in its own file).
//!
//! - `docs/reference/configuration.md` names every configuration key the code has (a key table
//!   with each key's default and environment variable, and one complete TOML example), and no
//!   other. The code's keys come from serde itself: every section refuses unknown keys, and the
//!   refusal lists the keys it knows, `Option` fields included.
//! - Every `section.key` the user docs name is a key the code has.
//! - `docs/reference/schema.md` names exactly the tables, columns and indexes that
//!   `migrations/*.sql` leave, applied in order.
//! - `docs/reference/metrics.md` names every metric the relay registers.
//! - The retry window the pages state is the one the code computes from the defaults.
//! - Every relative link in `README.md`, `DEVELOPMENT.md` and `docs/**/*.md` points to a file
//!   that exists, and every `#anchor` to a heading of its page.

mod configuration;
mod metrics;
mod retry_window;
mod schema;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `text` between pairs of backticks.
fn backticked(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// A value as the page may write it: no quotes, no spaces.
fn normalised(text: &str) -> String {
    text.chars()
        .filter(|c| *c != '"' && !c.is_whitespace())
        .collect()
}

fn difference(label: &str, a: &BTreeSet<String>, b: &BTreeSet<String>) -> Option<String> {
    let missing: Vec<&String> = a.difference(b).collect();
    (!missing.is_empty()).then(|| format!("{label}: {missing:?}"))
}

/// The user docs: `README.md` and `docs/`, not `docs/development/`.
fn user_pages() -> Vec<PathBuf> {
    markdown_pages()
        .into_iter()
        .filter(|p| {
            let relative = p.strip_prefix(repo_root()).unwrap_or(p);
            !relative.starts_with("docs/development") && relative != Path::new("DEVELOPMENT.md")
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Links

/// `README.md`, `DEVELOPMENT.md` and every page under `docs/`.
fn markdown_pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, pages: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, pages);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    let root = repo_root();
    let mut pages = vec![root.join("README.md"), root.join("DEVELOPMENT.md")];
    walk(&root.join("docs"), &mut pages);
    pages.sort();
    pages
}

/// The page's lines outside fenced code blocks.
fn prose_lines(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for line in prose_lines(text) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let slug = slug(heading.trim_start_matches('#'));
        let n = seen.entry(slug.clone()).or_default();
        anchors.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    anchors
}

/// The targets of the inline links `[text](target)` of a page's prose.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose_lines(text) {
        // Inline code is not a link.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join("");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            let target = rest[..end].split_whitespace().next().unwrap_or("");
            targets.push(target.to_string());
            rest = &rest[end..];
        }
    }
    targets
}

#[test]
fn every_relative_link_in_the_docs_points_to_a_file_and_heading_that_exist() {
    let mut broken = Vec::new();
    for page in markdown_pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            if !path.exists() {
                broken.push(format!("{}: ({target}): no such file", page.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                if path.extension().is_some_and(|e| e == "md") {
                    let linked = std::fs::read_to_string(&path).unwrap();
                    if !anchors(&linked).contains(anchor) {
                        broken.push(format!("{}: ({target}): no such heading", page.display()));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn headings_become_githubs_anchors() {
    assert_eq!(
        slug(" `status`: is it healthy?"),
        "status-is-it-healthy".to_string()
    );
    assert_eq!(
        slug(" Retry, resend, mark-failed"),
        "retry-resend-mark-failed".to_string()
    );
    let text = "# A\n```\n# not a heading\n```\n## A\n";
    assert_eq!(anchors(text), ["a".to_string(), "a-1".to_string()].into());
    assert_eq!(
        link_targets("see [x](a.md#b) and `[y](c.md)` and [z](d.md)"),
        vec!["a.md#b".to_string(), "d.md".to_string()]
    );
}
