//! `sluice quota set|get|list|delete|check META-URL --path DIR ...`:
//! directory quotas, stored as JuiceFS stores them, with `juicefs quota`'s
//! arguments (`--capacity` in GiB unless a unit is given). And `sluice
//! config META-URL --capacity --inodes`: the volume's own limits.

use anyhow::{Context as _, bail};
use sluice_engine::Error;
use sluice_engine::meta::quota::tree_usage;
use sluice_engine::meta::{
    Context, DirQuota, FileType, Ino, Meta, MetaUrl, QuotaChange, ROOT_INO, TRASH_INO,
    open_existing_meta,
};
use sluice_engine::size::{SizeRange, Unit, format_size, parse_size};
use sluice_engine::volume::{enable_dir_stats, set_volume_limits};

/// Arguments of `sluice quota`.
#[derive(Debug, clap::Args)]
pub struct QuotaArgs {
    #[command(subcommand)]
    pub command: QuotaCommand,
}

/// What `sluice quota` does.
#[derive(Debug, clap::Subcommand)]
pub enum QuotaCommand {
    /// Set a directory's quota (creating it computes the usage below it).
    Set(SetArgs),
    /// Show a directory's quota and usage.
    Get(PathArgs),
    /// List every directory quota.
    #[command(alias = "ls")]
    List(ListArgs),
    /// Remove a directory's quota.
    #[command(alias = "del")]
    Delete(PathArgs),
    /// Compare a quota's usage with the tree below it (--repair fixes it).
    Check(CheckArgs),
}

/// A volume and a directory in it.
#[derive(Debug, clap::Args)]
pub struct PathArgs {
    /// Metadata engine URL.
    pub meta_url: MetaUrl,
    /// Full path of the directory within the volume, e.g. /projects/a.
    #[arg(long)]
    pub path: String,
}

/// Arguments of `sluice quota set`.
#[derive(Debug, clap::Args)]
pub struct SetArgs {
    #[command(flatten)]
    pub dir: PathArgs,
    /// Space limit, in GiB unless a unit is given (512M, 1.5T); 0 removes
    /// the space limit.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_gib)]
    pub capacity: Option<u64>,
    /// Inode limit; 0 removes it.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_count)]
    pub inodes: Option<u64>,
    /// Create the directory (and its parents) if it does not exist.
    #[arg(long)]
    pub create: bool,
    /// Accepted for `juicefs quota` compatibility: usage is always computed
    /// from the tree itself.
    #[arg(long)]
    pub strict: bool,
}

/// Arguments of `sluice quota list`.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Metadata engine URL.
    pub meta_url: MetaUrl,
}

/// Arguments of `sluice quota check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub dir: PathArgs,
    /// Store the usage found when it differs from the quota's.
    #[arg(long)]
    pub repair: bool,
    /// Accepted for `juicefs quota` compatibility: the tree is always
    /// walked entry by entry.
    #[arg(long)]
    pub strict: bool,
}

/// Arguments of `sluice config`.
#[derive(Debug, clap::Args)]
pub struct ConfigArgs {
    /// Metadata engine URL.
    pub meta_url: MetaUrl,
    /// The volume's space limit, in GiB unless a unit is given; 0 = none.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_gib)]
    pub capacity: Option<u64>,
    /// The volume's inode limit; 0 = none.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_count)]
    pub inodes: Option<u64>,
}

/// The largest `--capacity`: JuiceFS keeps quotas as signed 64-bit byte
/// counts.
const MAX_CAPACITY: u64 = i64::MAX as u64;

/// Parses `--capacity` as `juicefs` does: a size whose bare number is GiB
/// (fractions allowed), such as `100`, `512M` or `1.5T` (see
/// `sluice_engine::size`).
pub fn parse_gib(s: &str) -> Result<u64, String> {
    if s.trim().starts_with('-') {
        return Err(format!("{s:?} is negative; give 0 for no limit"));
    }
    parse_size(s, Unit::Gib, SizeRange::new(0, MAX_CAPACITY)).map_err(|e| e.to_string())
}

/// Parses an inode count: a whole number, 0 for no limit.
pub fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("{s:?} is negative; give 0 for no limit"));
    }
    t.parse()
        .map_err(|_| format!("cannot read {s:?} as a whole number of inodes"))
}

/// Runs `sluice quota`.
pub fn run(args: QuotaArgs) -> anyhow::Result<()> {
    match args.command {
        QuotaCommand::Set(a) => set(a),
        QuotaCommand::Get(a) => get(a),
        QuotaCommand::List(a) => list(a),
        QuotaCommand::Delete(a) => delete(a),
        QuotaCommand::Check(a) => check(a),
    }
}

/// Runs `sluice config`.
pub fn config(args: ConfigArgs) -> anyhow::Result<()> {
    let meta = open(&args.meta_url)?;
    if args.capacity.is_none() && args.inodes.is_none() {
        bail!("nothing to change: give --capacity and/or --inodes");
    }
    let f = set_volume_limits(&*meta, args.capacity, args.inodes)
        .context("cannot change the volume's limits")?;
    let st = meta.statfs(&Context::internal(), ROOT_INO)?;
    let used = st.total_space - st.avail_space;
    if (f.capacity > 0 && used >= f.capacity) || (f.inodes > 0 && st.used_inodes >= f.inodes) {
        eprintln!(
            "warning: the volume already uses {} in {} inodes, at or past the new limits: \
             every write that needs more fails with ENOSPC",
            size(used as i64),
            st.used_inodes
        );
    }
    println!(
        "volume {}: capacity {}, inodes {}",
        f.name,
        if f.capacity > 0 {
            size(f.capacity as i64)
        } else {
            "unlimited".into()
        },
        if f.inodes > 0 {
            f.inodes.to_string()
        } else {
            "unlimited".into()
        }
    );
    Ok(())
}

fn open(url: &MetaUrl) -> anyhow::Result<std::sync::Arc<dyn Meta>> {
    let meta = open_existing_meta(url.expose())
        .with_context(|| format!("cannot open metadata engine {url}"))?;
    match meta.load() {
        Ok(_) => Ok(meta),
        Err(Error::NotFound) => bail!("{url} holds no volume (run sluice format first)"),
        Err(e) => Err(e).context("cannot read the volume settings"),
    }
}

/// The inode of directory `path` (absolute, within the volume), creating
/// missing directories when `create` is set.
fn resolve(meta: &dyn Meta, path: &str, create: bool) -> anyhow::Result<Ino> {
    if !path.starts_with('/') {
        bail!("--path {path:?} must be absolute within the volume, e.g. /dir");
    }
    let ctx = Context::internal();
    let mut ino = ROOT_INO;
    for name in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if name == ".." {
            bail!("--path {path:?} must not contain '..'");
        }
        ino = match meta.lookup(&ctx, ino, name.as_bytes()) {
            Ok((i, a)) if a.typ == FileType::Directory => i,
            Ok(_) => bail!("{path}: {name} is not a directory"),
            Err(Error::NotFound) if create => {
                meta.mkdir(&ctx, ino, name.as_bytes(), 0o755, 0)
                    .with_context(|| format!("cannot create {name} in {path}"))?
                    .0
            }
            Err(Error::NotFound) => bail!("{path}: no such directory (--create makes it)"),
            Err(e) => return Err(e).with_context(|| format!("cannot look up {path}")),
        };
        if ino >= TRASH_INO {
            bail!("{path}: the trash has no quotas");
        }
    }
    Ok(ino)
}

fn set(a: SetArgs) -> anyhow::Result<()> {
    if a.capacity.is_none() && a.inodes.is_none() {
        bail!("give --capacity and/or --inodes");
    }
    let to_i64 = |v: u64, what: &str| {
        i64::try_from(v).map_err(|_| anyhow::anyhow!("--{what} {v} is too large"))
    };
    let change = QuotaChange {
        max_space: a.capacity.map(|c| to_i64(c, "capacity")).transpose()?,
        max_inodes: a.inodes.map(|i| to_i64(i, "inodes")).transpose()?,
        usage: None,
    };
    let meta = open(&a.dir.meta_url)?;
    let ino = resolve(&*meta, &a.dir.path, a.create)?;
    enable_dir_stats(&*meta).context("cannot turn on the directory statistics")?;
    let created = meta
        .set_dir_quota(ino, &change)
        .with_context(|| format!("cannot set the quota of {}", a.dir.path))?;
    if created {
        // As JuiceFS: a new quota starts with the usage already below it.
        let (space, inodes) = tree_usage(&*meta, ino)
            .with_context(|| format!("cannot compute the usage below {}", a.dir.path))?;
        meta.set_dir_quota(
            ino,
            &QuotaChange {
                usage: Some((space, inodes)),
                ..QuotaChange::default()
            },
        )
        .with_context(|| {
            format!(
                "cannot store the usage of {} (sluice quota check --repair fixes it)",
                a.dir.path
            )
        })?;
    }
    show(&*meta, &a.dir.path, ino)
}

fn show(meta: &dyn Meta, path: &str, ino: Ino) -> anyhow::Result<()> {
    let q = meta
        .get_dir_quota(ino)?
        .with_context(|| format!("{path} has no quota"))?;
    print_table(&[(path.to_string(), q)]);
    Ok(())
}

fn get(a: PathArgs) -> anyhow::Result<()> {
    let meta = open(&a.meta_url)?;
    let ino = resolve(&*meta, &a.path, false)?;
    show(&*meta, &a.path, ino)
}

fn delete(a: PathArgs) -> anyhow::Result<()> {
    let meta = open(&a.meta_url)?;
    let ino = resolve(&*meta, &a.path, false)?;
    if meta.get_dir_quota(ino)?.is_none() {
        bail!("{} has no quota", a.path);
    }
    meta.delete_dir_quota(ino)
        .with_context(|| format!("cannot delete the quota of {}", a.path))?;
    println!("quota of {} deleted", a.path);
    Ok(())
}

fn list(a: ListArgs) -> anyhow::Result<()> {
    let meta = open(&a.meta_url)?;
    let mut rows = Vec::new();
    for (ino, q) in meta.dir_quotas()? {
        if !q.limits() {
            continue;
        }
        let name = path_of(&*meta, ino).unwrap_or_else(|| format!("inode:{ino}"));
        rows.push((name, q));
    }
    rows.sort_by(|x, y| x.0.cmp(&y.0));
    print_table(&rows);
    Ok(())
}

fn check(a: CheckArgs) -> anyhow::Result<()> {
    let meta = open(&a.dir.meta_url)?;
    let ino = resolve(&*meta, &a.dir.path, false)?;
    let Some(q) = meta.get_dir_quota(ino)? else {
        bail!("no quota for {} (inode {ino})", a.dir.path);
    };
    let (space, inodes) = tree_usage(&*meta, ino)
        .with_context(|| format!("cannot compute the usage below {}", a.dir.path))?;
    if (q.used_space, q.used_inodes) == (space, inodes) {
        println!("quota of {} is consistent", a.dir.path);
        print_table(&[(a.dir.path.clone(), q)]);
        return Ok(());
    }
    eprintln!(
        "{}: quota ({} inodes, {}) != tree ({} inodes, {})",
        a.dir.path,
        q.used_inodes,
        size(q.used_space),
        inodes,
        size(space)
    );
    if !a.repair {
        bail!(
            "quota of {} is inconsistent; repair it with --repair",
            a.dir.path
        );
    }
    meta.set_dir_quota(
        ino,
        &QuotaChange {
            usage: Some((space, inodes)),
            ..QuotaChange::default()
        },
    )
    .with_context(|| format!("cannot repair the quota of {}", a.dir.path))?;
    println!("quota of {} repaired", a.dir.path);
    show(&*meta, &a.dir.path, ino)
}

/// A path naming directory `ino`, found through its parents (None when
/// the chain is broken: the directory is gone or in the trash).
fn path_of(meta: &dyn Meta, mut ino: Ino) -> Option<String> {
    let ctx = Context::internal();
    let mut names = Vec::new();
    for _ in 0..4096 {
        if ino == ROOT_INO {
            names.reverse();
            return Some(format!("/{}", names.join("/")));
        }
        let parent = meta.getattr(ino).ok()?.parent;
        if parent == 0 || parent >= TRASH_INO {
            return None;
        }
        let entry = meta
            .readdir(&ctx, parent, false)
            .ok()?
            .into_iter()
            .find(|e| e.inode == ino && e.name != b"." && e.name != b"..")?;
        names.push(String::from_utf8_lossy(&entry.name).into_owned());
        ino = parent;
    }
    None
}

fn size(bytes: i64) -> String {
    format_size(bytes.max(0) as u64)
}

/// Prints quotas as `juicefs quota` does: path, limit, usage and percentage
/// for space, then for inodes ("unlimited" where no limit is set).
fn print_table(rows: &[(String, DirQuota)]) {
    let mut lines = vec![[
        "Path".to_string(),
        "Size".into(),
        "Used".into(),
        "Use%".into(),
        "Inodes".into(),
        "IUsed".into(),
        "IUse%".into(),
    ]];
    for (path, q) in rows {
        let pct = |used: i64, max: i64| {
            if max > 0 {
                format!("{}%", used.max(0) * 100 / max)
            } else {
                String::new()
            }
        };
        lines.push([
            path.clone(),
            if q.max_space > 0 {
                size(q.max_space)
            } else {
                "unlimited".into()
            },
            size(q.used_space),
            pct(q.used_space, q.max_space),
            if q.max_inodes > 0 {
                q.max_inodes.to_string()
            } else {
                "unlimited".into()
            },
            q.used_inodes.max(0).to_string(),
            pct(q.used_inodes, q.max_inodes),
        ]);
    }
    let mut widths = [0usize; 7];
    for l in &lines {
        for (w, c) in widths.iter_mut().zip(l) {
            *w = (*w).max(c.len());
        }
    }
    for l in &lines {
        let cells: Vec<String> = l
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", cells.join(" | ").trim_end());
    }
}

#[cfg(test)]
mod tests {
    use super::parse_gib;

    #[test]
    fn capacity_is_gib_unless_a_unit_says_otherwise() {
        assert_eq!(parse_gib("1"), Ok(1 << 30));
        assert_eq!(parse_gib("0.5"), Ok(512 << 20));
        assert_eq!(parse_gib("0"), Ok(0));
        assert_eq!(parse_gib("512M"), Ok(512 << 20));
        assert_eq!(parse_gib("64K"), Ok(64 << 10));
        assert!(parse_gib("-1").is_err());
        assert!(parse_gib("lots").is_err());
        assert_eq!(super::parse_count("100"), Ok(100));
        assert!(super::parse_count("-3").is_err());
        assert!(super::parse_count("1.5").is_err());
    }
}
