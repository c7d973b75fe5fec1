//! The command line documents itself: `--help` works for every subcommand
//! (nested ones too), and `sluice completions` prints scripts that know them.

mod common;

use common::sluice;

/// The subcommands a `--help` output lists under "Commands:", without `help`.
fn subcommands_in(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| line.trim_end() != "Commands:")
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// Runs `sluice PATH... --help`, checks it, and returns what it printed.
fn help_of(path: &[&str]) -> String {
    let mut args = path.to_vec();
    args.push("--help");
    let out = sluice(&args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "sluice {}: {:?}\n{stdout}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let usage = format!(
        "Usage: {}",
        ["sluice"]
            .iter()
            .chain(path)
            .copied()
            .collect::<Vec<_>>()
            .join(" ")
    );
    assert!(
        stdout.contains(&usage),
        "sluice {}: no `{usage}`:\n{stdout}",
        args.join(" ")
    );
    stdout
}

/// The top-level subcommands, as `sluice --help` lists them.
fn top_level_subcommands() -> Vec<String> {
    let names = subcommands_in(&help_of(&[]));
    for expected in ["format", "mount", "serve", "umount", "completions"] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} not in {names:?}"
        );
    }
    names
}

#[test]
fn every_subcommand_answers_help() {
    let mut pending: Vec<Vec<String>> = top_level_subcommands()
        .into_iter()
        .map(|n| vec![n])
        .collect();
    let mut checked = 0;
    while let Some(path) = pending.pop() {
        let path_refs: Vec<&str> = path.iter().map(String::as_str).collect();
        let help = help_of(&path_refs);
        assert!(help.contains("Options:"), "sluice {path:?} --help:\n{help}");
        for child in subcommands_in(&help) {
            let mut deeper = path.clone();
            deeper.push(child);
            pending.push(deeper);
        }
        checked += 1;
    }
    // The top level's, plus at least quota's and bench's own subcommands.
    assert!(
        checked > top_level_subcommands().len(),
        "only {checked} checked"
    );
}

#[test]
fn bash_completion_offers_every_subcommand() {
    let out = sluice(&["completions", "bash"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let script = String::from_utf8_lossy(&out.stdout);
    assert!(script.contains("complete -F _sluice"), "{script}");
    // What `sluice <TAB>` offers: the `opts` of the `sluice)` case.
    let offered: Vec<&str> = script
        .lines()
        .skip_while(|line| line.trim() != "sluice)")
        .find_map(|line| line.trim().strip_prefix("opts=\""))
        .expect("the top level's opts list")
        .trim_end_matches('"')
        .split_whitespace()
        .collect();
    for name in top_level_subcommands() {
        assert!(
            offered.contains(&name.as_str()),
            "{name} not in {offered:?}"
        );
        assert!(
            script.contains(&format!("sluice,{name})")),
            "bash script lacks {name}"
        );
    }
    // And a flag of a subcommand, so the flags are there too.
    assert!(
        script.contains("--socket"),
        "bash script lacks serve's --socket"
    );
}

#[test]
fn zsh_and_fish_completions_name_the_subcommands() {
    for (shell, marker) in [("zsh", "#compdef sluice"), ("fish", "complete -c sluice")] {
        let out = sluice(&["completions", shell]);
        assert!(
            out.status.success(),
            "{shell}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains(marker), "{shell}: {script}");
        for name in ["mount", "serve", "completions"] {
            assert!(script.contains(name), "{shell} script lacks {name}");
        }
    }
}

#[test]
fn an_unknown_shell_is_refused() {
    let out = sluice(&["completions", "cmd.exe"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value"));
}
