//! `sluice dump META_URL [FILE]` and `sluice load META_URL [FILE]`: a
//! volume's metadata as JuiceFS's JSON dump, to back it up or move it to
//! another metadata engine (`juicefs dump` / `juicefs load` read and write
//! the same documents).

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use sluice_engine::dump::{DumpOptions, dump, load};
use sluice_engine::meta::{MetaUrl, open_existing_meta, open_meta};

/// Arguments of `sluice dump`.
#[derive(Debug, clap::Args)]
pub struct DumpArgs {
    /// The volume's metadata URL (sqlite3://PATH, redis://HOST/DB).
    pub meta_url: MetaUrl,
    /// Where the dump goes (default: standard output).
    pub file: Option<PathBuf>,
    /// Keep the secret key, session token and encryption key in the dump.
    #[arg(long)]
    pub keep_secret_key: bool,
}

/// Arguments of `sluice load`.
#[derive(Debug, clap::Args)]
pub struct LoadArgs {
    /// An empty metadata store's URL (sqlite3://NEW_PATH, redis://HOST/DB).
    pub meta_url: MetaUrl,
    /// The dump to read (default: standard input).
    pub file: Option<PathBuf>,
}

/// A progress counter on standard error when it is a terminal: a bar
/// towards `total` (nodes, or `bytes`) when it is known, a counting
/// spinner otherwise.
fn bar(what: &'static str, total: Option<u64>, bytes: bool) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = match total {
        Some(n) => {
            let bar = indicatif::ProgressBar::new(n);
            let template = if bytes {
                "{msg} {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left)"
            } else {
                "{msg} {wide_bar} {pos}/{len} ({per_sec}, {eta} left)"
            };
            if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
                bar.set_style(style);
            }
            bar
        }
        None => indicatif::ProgressBar::new_spinner(),
    };
    bar.set_message(what);
    bar
}

/// Runs `sluice dump`.
pub fn run_dump(args: DumpArgs) -> anyhow::Result<()> {
    let meta = open_existing_meta(args.meta_url.expose())
        .with_context(|| format!("cannot open {}", args.meta_url))?;
    let opts = DumpOptions {
        keep_secret_key: args.keep_secret_key,
    };
    // The volume's inode counter (plus the root) is the bar's length; a
    // volume in use may end a little off it.
    let total = meta
        .counters()
        .ok()
        .map(|c| c.used_inodes.max(0) as u64 + 1);
    let bar = bar("nodes dumped", total, false);
    let mut progress = |n: u64| bar.set_position(n);
    let summary = match &args.file {
        Some(path) => {
            let file = std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            dump(meta.as_ref(), file, &opts, &mut progress)?
        }
        None => dump(
            meta.as_ref(),
            std::io::stdout().lock(),
            &opts,
            &mut progress,
        )?,
    };
    bar.finish_and_clear();
    log::info!("dumped {} nodes of {}", summary.nodes, args.meta_url);
    Ok(())
}

/// A reader that counts the bytes read through it (the load's progress).
struct Counted<R> {
    inner: R,
    read: Arc<AtomicU64>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Runs `sluice load`.
pub fn run_load(args: LoadArgs) -> anyhow::Result<()> {
    // The dump first: a mistyped file name must not leave a new, empty
    // database behind.
    let file = args
        .file
        .as_ref()
        .map(|path| {
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))
        })
        .transpose()?;
    let meta = open_meta(args.meta_url.expose())
        .with_context(|| format!("cannot open {}", args.meta_url))?;
    let summary = match file {
        Some(file) => {
            // A file's length is known: the bar follows the bytes parsed.
            let total = file
                .metadata()
                .ok()
                .filter(|m| m.is_file())
                .map(|m| m.len());
            let bar = bar("loading", total, true);
            let read = Arc::new(AtomicU64::new(0));
            let mut input = Counted {
                inner: file,
                read: read.clone(),
            };
            let mut progress = |_nodes: u64| bar.set_position(read.load(Ordering::Relaxed));
            let r = load(meta.as_ref(), &mut input, &mut progress);
            bar.finish_and_clear();
            r
        }
        None => {
            let bar = bar("nodes loaded", None, false);
            let mut progress = |n: u64| bar.set_position(n);
            let r = load(meta.as_ref(), &mut std::io::stdin(), &mut progress);
            bar.finish_and_clear();
            r
        }
    }
    .with_context(|| format!("cannot load into {}", args.meta_url))?;
    if summary.del_files_skipped > 0 {
        log::warn!(
            "{} files pending deletion were not loaded; `sluice gc` finds their objects",
            summary.del_files_skipped
        );
    }
    log::info!("loaded {} nodes into {}", summary.nodes, args.meta_url);
    Ok(())
}
