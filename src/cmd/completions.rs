//! `sluice completions SHELL`: the shell completion script, generated from
//! the same command-line definitions the program parses (clap_complete), so
//! it never lags behind a new flag.

use std::io::Write as _;

use anyhow::Context as _;
use clap_complete::Shell;

/// The arguments of `sluice completions`.
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Prints the completion script of `command` for the chosen shell.
pub fn run(args: CompletionsArgs, mut command: clap::Command) -> anyhow::Result<()> {
    // Generated into memory first: clap_complete panics when its writer
    // fails, and `sluice completions bash | head` should not.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "sluice", &mut script);
    match std::io::stdout().lock().write_all(&script) {
        // A reader that stopped early (`| head`) is no error of ours.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        written => written.context("cannot write the completion script"),
    }
}
