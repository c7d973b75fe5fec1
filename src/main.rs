//! The `sluice` command-line program.

use std::process::ExitCode;

use clap::{CommandFactory as _, Parser, Subcommand};

mod cmd;
mod metrics;
mod notify;
mod sandbox;

/// mimalloc keeps freed pages for reuse per thread: the data path allocates
/// and frees multi-MiB block buffers all the time, and the system allocator
/// returns them to the kernel (munmap) and faults them in again.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// sluice: a JuiceFS-format storage engine that feeds AI training VMs over virtio-fs.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create a volume, or format one again (keeping every setting not given).
    Format(cmd::format::FormatArgs),
    /// Mount a volume on this host through the kernel's FUSE.
    Mount(cmd::mount::MountArgs),
    /// Serve a volume to a VM as a virtio-fs device over vhost-user.
    Serve(cmd::serve::ServeArgs),
    /// The host daemon of a volume: block caches and fetches shared by every VM's `serve --host`.
    Host(cmd::host::HostArgs),
    /// Unmount a sluice mount point.
    Umount(cmd::mount::UmountArgs),
    /// Show a volume's settings, or a file's chunks, slices and objects.
    Info(cmd::info::InfoArgs),
    /// The writeback backlog: blocks staged on local disk, not yet uploaded.
    Status(cmd::status::StatusArgs),
    /// A running mount's or VM daemon's activity, one line a second (as `juicefs stats`).
    Stats(cmd::stats::StatsArgs),
    /// Check a volume's metadata and objects, and repair its counters (as `juicefs fsck`).
    Fsck(cmd::fsck::FsckArgs),
    /// Find (and with --delete remove) objects no slice references.
    Gc(cmd::gc::GcArgs),
    /// Directory quotas: set, get, list, delete, check (as `juicefs quota`).
    Quota(cmd::quota::QuotaArgs),
    /// Change a volume's capacity and inode limits (as `juicefs config`).
    Config(cmd::quota::ConfigArgs),
    /// Pull files into a running daemon's caches (or --evict, --check).
    Warmup(cmd::warmup::WarmupArgs),
    /// Object-store throughput: put/get/head/list/delete of blocks and small objects.
    Objbench(cmd::objbench::ObjbenchArgs),
    /// Benchmarks: `sluice bench PATH` (file system), `sluice bench mlperf ...` (MLPerf Storage).
    Bench(sluice_benches::command::BenchArgs),
    /// Print a shell completion script: `sluice completions bash|zsh|fish`.
    Completions(cmd::completions::CompletionsArgs),
    /// Write a volume's metadata as a JuiceFS JSON dump (as `juicefs dump`).
    Dump(cmd::dump::DumpArgs),
    /// Load a JuiceFS JSON dump into an empty metadata store (as `juicefs load`).
    Load(cmd::dump::LoadArgs),
    /// Write the vhost-user descriptor that lets libvirt start sluice as a virtio-fs backend.
    InstallLibvirt(cmd::libvirt::InstallArgs),
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Format(args) => cmd::format::run(args),
        Command::Mount(args) => cmd::mount::run(args),
        Command::Serve(args) => cmd::serve::run(args),
        Command::Host(args) => cmd::host::run(args),
        Command::Umount(args) => cmd::mount::umount(args),
        Command::Info(args) => cmd::info::run(args),
        Command::Status(args) => cmd::status::run(args),
        Command::Stats(args) => cmd::stats::run(args),
        Command::Fsck(args) => cmd::fsck::run(args),
        Command::Gc(args) => cmd::gc::run(args),
        Command::Quota(args) => cmd::quota::run(args),
        Command::Config(args) => cmd::quota::config(args),
        Command::Objbench(args) => cmd::objbench::run(args),
        Command::Warmup(args) => cmd::warmup::run(args),
        Command::Bench(args) => Ok(sluice_benches::command::run(args)?),
        Command::Completions(args) => cmd::completions::run(args, Cli::command()),
        Command::Dump(args) => cmd::dump::run_dump(args),
        Command::Load(args) => cmd::dump::run_load(args),
        Command::InstallLibvirt(args) => cmd::libvirt::install(args),
    }
}

/// Raises this process's soft limit of open files to its hard limit (at
/// most 2^20), as servers do: a mount keeps each object it wrote open
/// until the group commit syncs it (`engine/src/object/file.rs`), and
/// systemd and shells start processes with a soft limit of 1024. A failure
/// leaves the limit as it was; the file store sizes itself to what it finds.
fn raise_open_file_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            let want = lim.rlim_max.min(1 << 20);
            if want > lim.rlim_cur {
                lim.rlim_cur = want;
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            }
        }
    }
}

fn main() -> ExitCode {
    // `sluice serve`'s socket helper is this program, executed again.
    cmd::socket_cleanup::run_if_helper();
    raise_open_file_limit();
    // libvirt, Kata Containers and Cloud Hypervisor users start their
    // virtio-fs backend with virtiofsd's command line (`--fd=N -o
    // source=...`, `--socket-path P --shared-dir DIR ...`); that mode sets
    // up logging as virtiofsd's options say (`--log-level`, `--syslog`).
    // (Lossy: a command line that is not UTF-8 goes on to clap, which says so.)
    let argv: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let result = if cmd::libvirt::is_virtiofsd_command_line(&argv) {
        cmd::libvirt::run(&argv)
    } else {
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
        run(Cli::parse())
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::Cli;

    /// A command line's arguments, dumped with `{:?}` (a log line, a panic),
    /// show no password and no secret key.
    #[test]
    fn no_parsed_command_line_debug_prints_a_secret() {
        let url = "redis://user:s3cret-pw@127.0.0.1:6379/1";
        let lines: [&[&str]; 7] = [
            &[
                "format",
                url,
                "vol",
                "--storage",
                "s3",
                "--bucket",
                "http://127.0.0.1:9000/b",
                "--access-key",
                "AK",
                "--secret-key",
                "s3cret-key",
            ],
            &["mount", url, "/mnt"],
            &["serve", url, "--socket", "/tmp/s.sock"],
            &["info", url],
            &["gc", url],
            &["status", url],
            &[
                "objbench",
                "--storage",
                "s3",
                "--bucket",
                "http://127.0.0.1:9000/b",
                "--access-key",
                "AK",
                "--secret-key",
                "s3cret-key",
            ],
        ];
        for args in lines {
            let cli = Cli::try_parse_from(std::iter::once("sluice").chain(args.iter().copied()))
                .unwrap_or_else(|e| panic!("{args:?}: {e}"));
            for dump in [format!("{cli:?}"), format!("{cli:#?}")] {
                assert!(!dump.contains("s3cret"), "{args:?}: {dump}");
            }
        }
    }
}
