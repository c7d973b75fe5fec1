//! The service user: finding it, handing it the volume's local files, and
//! switching to it.

use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

use super::LocalState;

/// Directories the system shares with others: the daemon never takes one
/// over, so the volume's files must live in a directory of their own.
pub(super) const SHARED_DIRS: &[&str] = &[
    "/",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/media",
    "/mnt",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/srv",
    "/sys",
    "/tmp",
    "/usr",
    "/var",
    "/var/cache",
    "/var/lib",
    "/var/lib/private",
    "/var/log",
    "/var/run",
    "/var/spool",
    "/var/tmp",
];

/// The user `sluice serve` runs as once set up.
#[derive(Debug, Clone)]
pub struct ServiceUser {
    /// Its name (or the number it was given as, without a passwd entry).
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary group.
    pub gid: u32,
    /// Its groups, the primary one included.
    pub groups: Vec<u32>,
}

impl ServiceUser {
    /// The user called `name`, or with uid `name`; a uid without a passwd
    /// entry runs with the group of the same number and no others.
    pub fn lookup(name: &str) -> io::Result<ServiceUser> {
        let entry = match name.parse::<u32>() {
            Ok(uid) => passwd_by_uid(uid)?.or(Some((name.to_owned(), uid, uid))),
            Err(_) => passwd_by_name(name)?,
        };
        let Some((name, uid, gid)) = entry else {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no passwd entry"));
        };
        let groups = group_list(&name, gid);
        Ok(ServiceUser {
            name,
            uid,
            gid,
            groups,
        })
    }

    /// Whether the user may pass through (search) a directory with `meta`.
    fn may_search(&self, meta: &std::fs::Metadata) -> bool {
        let mode = meta.mode();
        if meta.uid() == self.uid {
            mode & 0o100 != 0
        } else if self.groups.contains(&meta.gid()) {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        }
    }
}

type PasswdEntry = Option<(String, u32, u32)>;

fn passwd_by_name(name: &str) -> io::Result<PasswdEntry> {
    let c = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a user name with NUL"))?;
    // SAFETY: `c` is a valid C string for the call; `fill` hands valid
    // buffers to getpwnam_r.
    fill_passwd(|pwd, buf, len, found| unsafe {
        libc::getpwnam_r(c.as_ptr(), pwd, buf, len, found)
    })
}

fn passwd_by_uid(uid: u32) -> io::Result<PasswdEntry> {
    // SAFETY: `fill` hands valid buffers to getpwuid_r.
    fill_passwd(|pwd, buf, len, found| unsafe { libc::getpwuid_r(uid, pwd, buf, len, found) })
}

/// Runs a getpw*_r call with a buffer and reads the entry it found.
fn fill_passwd(
    call: impl FnOnce(
        *mut libc::passwd,
        *mut libc::c_char,
        usize,
        *mut *mut libc::passwd,
    ) -> libc::c_int,
) -> io::Result<PasswdEntry> {
    // SAFETY: `passwd` is plain data (integers and pointers); all zeros is
    // a valid value, overwritten by the call.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    let r = call(&mut pwd, buf.as_mut_ptr(), buf.len(), &mut found);
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    if found.is_null() {
        return Ok(None);
    }
    // SAFETY: the call succeeded and found an entry, so `pw_name` points to
    // a NUL-terminated string inside `buf`, which is alive here.
    let name = unsafe { CStr::from_ptr(pwd.pw_name) }
        .to_string_lossy()
        .into_owned();
    Ok(Some((name, pwd.pw_uid, pwd.pw_gid)))
}

/// The groups `name` belongs to (from /etc/group), `gid` first.
fn group_list(name: &str, gid: u32) -> Vec<u32> {
    let Ok(c) = CString::new(name) else {
        return vec![gid];
    };
    let mut groups = vec![0 as libc::gid_t; 256];
    let mut n = groups.len() as libc::c_int;
    // SAFETY: `c` is a valid C string, `groups` holds `n` entries.
    let r = unsafe { libc::getgrouplist(c.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
    if r < 0 {
        return vec![gid];
    }
    groups.truncate(n.max(0) as usize);
    if !groups.contains(&gid) {
        groups.insert(0, gid);
    }
    groups
}

/// Checks that the system shares none of `state`'s directories, and
/// creates the trees that do not exist yet (given to `user`), before
/// Landlock is set up on them.
pub fn prepare(state: &LocalState, user: &ServiceUser) -> anyhow::Result<()> {
    let fix = "move it into a directory of its own, or keep root with --user root";
    if let Some(db) = &state.database {
        let dir = database_dir(db)?;
        if is_shared(&dir)? {
            bail!(
                "the database {} is in {}, a directory the system shares; sluice serve gives \
                 the database's directory to the user it runs as ({}), so {fix}",
                db.display(),
                dir.display(),
                user.name
            );
        }
    }
    for tree in &state.trees {
        create_owned(tree, user)?;
        let tree = std::fs::canonicalize(tree)
            .with_context(|| format!("cannot find {}", tree.display()))?;
        if is_shared(&tree)? {
            bail!(
                "{} is a directory the system shares; sluice serve gives the volume's \
                 directories to the user it runs as ({}), so {fix}",
                tree.display(),
                user.name
            );
        }
    }
    Ok(())
}

/// The directory holding the database, which SQLite creates files in.
pub fn database_dir(db: &Path) -> anyhow::Result<PathBuf> {
    let db = std::fs::canonicalize(db)
        .with_context(|| format!("cannot find the database {}", db.display()))?;
    Ok(db.parent().unwrap_or(Path::new("/")).to_owned())
}

/// Gives `state` to `user`: the database with its `-wal`/`-shm`/`-journal`
/// and its directory (SQLite creates files there), and each tree with
/// everything in it (on the same file system; links are not followed).
/// Called once the volume is open (it creates files there as root), before
/// the switch; fails when `user` cannot reach a path.
pub fn hand_over(state: &LocalState, user: &ServiceUser) -> anyhow::Result<()> {
    if let Some(db) = &state.database {
        let db = std::fs::canonicalize(db)
            .with_context(|| format!("cannot find the database {}", db.display()))?;
        give(&database_dir(&db)?, user)?;
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut name = db.clone().into_os_string();
            name.push(suffix);
            let path = PathBuf::from(name);
            if path.symlink_metadata().is_ok() {
                give(&path, user)?;
            }
        }
        reachable(&db, user)?;
    }
    for tree in &state.trees {
        let tree = std::fs::canonicalize(tree)
            .with_context(|| format!("cannot find {}", tree.display()))?;
        let dev = tree.symlink_metadata()?.dev();
        let changed = give_tree(&tree, dev, user)
            .with_context(|| format!("cannot give {} to {}", tree.display(), user.name))?;
        if changed > 0 {
            log::info!(
                "gave {changed} files and directories in {} to {}",
                tree.display(),
                user.name
            );
        }
        reachable(&tree, user)?;
    }
    Ok(())
}

/// Whether `dir` is a directory the system (or other users) share: one of
/// the well-known ones, or one with the sticky bit or writable by others.
pub(super) fn is_shared(dir: &Path) -> anyhow::Result<bool> {
    let meta = dir
        .metadata()
        .with_context(|| format!("cannot read {}", dir.display()))?;
    Ok(SHARED_DIRS.iter().any(|d| Path::new(d) == dir) || meta.mode() & 0o1002 != 0)
}

/// Creates `dir` and its missing parents (mode 0700), giving the ones it
/// created to `user`.
fn create_owned(dir: &Path, user: &ServiceUser) -> anyhow::Result<()> {
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(p) = at {
        if p.as_os_str().is_empty() || p.symlink_metadata().is_ok() {
            break;
        }
        missing.push(p.to_owned());
        at = p.parent();
    }
    for p in missing.iter().rev() {
        match std::fs::DirBuilder::new().mode(0o700).create(p) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", p.display())),
        }
        give(p, user)?;
    }
    Ok(())
}

/// Gives one file or directory (not a link's target) to `user`.
fn give(path: &Path, user: &ServiceUser) -> anyhow::Result<()> {
    let meta = path
        .symlink_metadata()
        .with_context(|| format!("cannot read {}", path.display()))?;
    if meta.uid() != user.uid || meta.gid() != user.gid {
        std::os::unix::fs::lchown(path, Some(user.uid), Some(user.gid))
            .with_context(|| format!("cannot give {} to {}", path.display(), user.name))?;
    }
    Ok(())
}

/// Gives `dir` and everything under it on device `dev` to `user`; returns
/// how many entries changed owner.
fn give_tree(dir: &Path, dev: u64, user: &ServiceUser) -> io::Result<u64> {
    let mut changed = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let meta = d.symlink_metadata()?;
        if meta.uid() != user.uid || meta.gid() != user.gid {
            std::os::unix::fs::lchown(&d, Some(user.uid), Some(user.gid))?;
            changed += 1;
        }
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let path = entry.path();
            let Ok(meta) = path.symlink_metadata() else {
                continue; // gone meanwhile
            };
            if meta.is_dir() {
                if meta.dev() == dev {
                    stack.push(path);
                }
            } else if meta.uid() != user.uid || meta.gid() != user.gid {
                std::os::unix::fs::lchown(&path, Some(user.uid), Some(user.gid))?;
                changed += 1;
            }
        }
    }
    Ok(changed)
}

/// Checks that `user` can pass through every directory above `path`.
fn reachable(path: &Path, user: &ServiceUser) -> anyhow::Result<()> {
    for dir in path.ancestors().skip(1) {
        if dir.as_os_str().is_empty() {
            continue;
        }
        let meta = dir
            .metadata()
            .with_context(|| format!("cannot read {}", dir.display()))?;
        if !user.may_search(&meta) {
            bail!(
                "{} cannot reach {}: {} (mode {:o}, owner uid {}) does not let it through; \
                 make it searchable (chmod o+x {}), or keep root with --user root",
                user.name,
                path.display(),
                dir.display(),
                meta.mode() & 0o7777,
                meta.uid(),
                dir.display()
            );
        }
    }
    Ok(())
}

/// Lifts the hard limit on locked memory, which only a process with
/// CAP_SYS_RESOURCE may do: io_uring fixed buffers (`--guest-io uring`)
/// count against it once the daemon no longer has CAP_IPC_LOCK; the
/// reactor raises its soft limit when it needs to. Returns whether the
/// daemon may lock what its rings need after the switch: the limit is
/// (now) unlimited, or it could not be lifted (a container without that
/// capability) and the daemon keeps the one it has — then
/// [`keeps_ipc_lock`] says whether CAP_IPC_LOCK can stand in for it.
pub fn raise_memlock_limit() -> bool {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return false;
    }
    if lim.rlim_max == libc::RLIM_INFINITY {
        return true;
    }
    lim.rlim_max = libc::RLIM_INFINITY;
    // SAFETY: `lim` is a valid rlimit.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) == 0 }
}

/// Whether the daemon keeps CAP_IPC_LOCK across the switch, given whether
/// the hard RLIMIT_MEMLOCK was lifted: only when it was not (root without
/// CAP_SYS_RESOURCE, as in most containers) and the process holds it now.
/// With it the kernel does not count io_uring fixed buffers against the
/// limit at all (`sluice_numa::memlock::exempt`).
pub fn keeps_ipc_lock(limit_lifted: bool) -> bool {
    !limit_lifted && sluice_numa::memlock::exempt()
}

/// `CAP_IPC_LOCK`'s bit in the capability sets.
const CAP_IPC_LOCK: u32 = 14;

/// `capset(2)`'s header and data (`_LINUX_CAPABILITY_VERSION_3`: two data
/// words, 64 capabilities).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}
const CAP_VERSION_3: u32 = 0x2008_0522;

/// Sets this thread's effective and permitted capabilities to `caps` (bits
/// of the first word) and nothing else.
fn set_capabilities(caps: u32) -> io::Result<()> {
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let data = [
        CapData {
            effective: caps,
            permitted: caps,
            inheritable: 0,
        },
        CapData::default(),
    ];
    // SAFETY: `header` and the two-element `data` are what capset reads for
    // version 3; the kernel writes nothing.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &raw mut header, data.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Switches every thread of the process to `user`: groups, gid, uid (glibc
/// runs each set*id call on all threads), and checks that root is gone.
/// With `keep_ipc_lock` every thread keeps CAP_IPC_LOCK, and only it
/// (see [`keeps_ipc_lock`]).
pub fn switch_to(user: &ServiceUser, keep_ipc_lock: bool) -> anyhow::Result<()> {
    let failed = |what: &str| {
        anyhow::Error::new(io::Error::last_os_error()).context(format!(
            "cannot switch to user {}: {what} failed",
            user.name
        ))
    };
    // SAFETY: `groups` holds `len` gids for the call.
    if unsafe { libc::setgroups(user.groups.len(), user.groups.as_ptr()) } != 0 {
        return Err(failed("setgroups"));
    }
    // SAFETY: plain system calls on integers.
    if unsafe { libc::setresgid(user.gid, user.gid, user.gid) } != 0 {
        return Err(failed("setresgid"));
    }
    // A thread's permitted capabilities survive setresuid only with its
    // KEEPCAPS flag, which is the calling thread's own (glibc broadcasts
    // the set*id calls to every thread, not prctl or capset): only this
    // thread keeps CAP_IPC_LOCK, and the threads it starts afterwards —
    // each VM's queue workers, which register the guest's memory with
    // their rings — inherit it. Threads the volume started before lose
    // every capability at the switch, as without it.
    if keep_ipc_lock {
        // SAFETY: plain prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) } != 0 {
            return Err(failed("prctl(PR_SET_KEEPCAPS)"));
        }
    }
    // SAFETY: as above.
    if unsafe { libc::setresuid(user.uid, user.uid, user.uid) } != 0 {
        return Err(failed("setresuid"));
    }
    if keep_ipc_lock {
        set_capabilities(1 << CAP_IPC_LOCK).map_err(|e| {
            anyhow::Error::new(e).context(format!(
                "cannot switch to user {}: keeping CAP_IPC_LOCK (capset) failed",
                user.name
            ))
        })?;
        // SAFETY: plain prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, 0, 0, 0, 0) } != 0 {
            return Err(failed("prctl(PR_SET_KEEPCAPS)"));
        }
    }
    // SAFETY: as above; with every id given up this must fail.
    if user.uid != 0 && unsafe { libc::setuid(0) } == 0 {
        bail!("switched to {}, yet could become root again", user.name);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn stranger() -> ServiceUser {
        ServiceUser {
            name: "stranger".into(),
            uid: 54_321,
            gid: 54_321,
            groups: vec![54_321],
        }
    }

    #[test]
    fn shared_directories_are_never_given_away() {
        assert!(is_shared(Path::new("/tmp")).unwrap());
        assert!(is_shared(Path::new("/var/lib")).unwrap());
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(!is_shared(dir.path()).unwrap());
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(is_shared(dir.path()).unwrap(), "writable by others");
        // A database straight in /tmp.
        let db = PathBuf::from(format!(
            "/tmp/sluice-sandbox-test-{}.db",
            std::process::id()
        ));
        std::fs::write(&db, b"").unwrap();
        let state = LocalState {
            database: Some(db.clone()),
            ..LocalState::default()
        };
        let e = prepare(&state, &stranger()).unwrap_err();
        let _ = std::fs::remove_file(&db);
        let text = format!("{e:#}");
        assert!(
            text.contains("is in /tmp, a directory the system shares"),
            "{text}"
        );
    }

    #[test]
    fn a_directory_the_user_cannot_pass_is_named_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let closed = dir.path().join("closed");
        std::fs::create_dir(&closed).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let inner = closed.join("bucket");
        std::fs::create_dir(&inner).unwrap();
        let e = reachable(&inner, &stranger()).unwrap_err();
        let text = format!("{e:#}");
        assert!(
            text.contains(&format!("chmod o+x {}", closed.display())),
            "{text}"
        );
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o711)).unwrap();
        reachable(&inner, &stranger()).unwrap();
    }
}
