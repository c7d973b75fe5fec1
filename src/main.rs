//! The `sluice` command-line program.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// sluice: a JuiceFS-format storage engine that feeds AI training VMs over virtio-fs.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Benchmarks: `sluice bench PATH` (file system), `sluice bench mlperf ...` (MLPerf Storage).
    Bench(sluice_benches::command::BenchArgs),
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Bench(args) => sluice_benches::command::run(args)?,
    }
    Ok(())
}

fn main() -> ExitCode {
    env_logger::init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice: {e:#}");
            ExitCode::FAILURE
        }
    }
}
