//! docs/reference/cli.md names every subcommand and every flag of `outbox-relay`, and names no
//! subcommand the binary does not have: the page is checked against the parser itself.

use super::Cli;
use clap::CommandFactory;
use std::collections::BTreeSet;

const PAGE: &str = include_str!("../../../../docs/reference/cli.md");

/// `(subcommand path, --flag)` for every long flag, and every subcommand path, of `command`.
fn walk(
    command: &clap::Command,
    path: &str,
    flags: &mut Vec<(String, String)>,
    subs: &mut Vec<String>,
) {
    for arg in command.get_arguments() {
        if let Some(long) = arg.get_long() {
            if long != "help" && long != "version" {
                flags.push((path.to_string(), format!("--{long}")));
            }
        }
    }
    for sub in command.get_subcommands() {
        let sub_path = format!("{path} {}", sub.get_name()).trim().to_string();
        subs.push(sub_path.clone());
        walk(sub, &sub_path, flags, subs);
    }
}

/// The first word of each row of the page's "Subcommands" table: `| `config check` / … |`.
fn documented_subcommands() -> BTreeSet<String> {
    let start = PAGE
        .find("## Subcommands")
        .expect("a \"## Subcommands\" section");
    let section = &PAGE[start..];
    let section = &section[..section[3..]
        .find("\n#")
        .map_or(section.len(), |end| end + 3)];
    (section.lines())
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split(['`', ' ']).next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_cli_page_names_every_subcommand_and_flag_and_no_other_subcommand() {
    let mut flags = Vec::new();
    let mut subs = Vec::new();
    walk(&Cli::command(), "", &mut flags, &mut subs);
    let missing_subs: Vec<_> = (subs.iter())
        .filter(|path| !PAGE.contains(&format!("`{path}`")) && !PAGE.contains(&format!("`{path} ")))
        .collect();
    let missing_flags: Vec<_> = (flags.iter())
        .filter(|(_, flag)| !PAGE.contains(&format!("`{flag}")))
        .map(|(path, flag)| format!("{path} {flag}"))
        .collect();
    let top: BTreeSet<String> = (subs.iter())
        .map(|path| path.split(' ').next().unwrap().to_string())
        .collect();
    let unknown: Vec<_> = documented_subcommands().difference(&top).cloned().collect();
    assert!(
        missing_subs.is_empty() && missing_flags.is_empty() && unknown.is_empty(),
        "docs/reference/cli.md: subcommands missing {missing_subs:?}, flags missing \
         {missing_flags:?}, subcommands the binary does not have {unknown:?}"
    );
}
