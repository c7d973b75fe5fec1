//! libvirt starts sluice as it starts virtiofsd: a real `libvirtd`
//! (Debian's `libvirt-daemon-system`) defines and starts a TCG domain whose
//! `<filesystem>` names the built `sluice` as its `<binary>` and a
//! directory of a `sluice mount` as its `<source dir>`; libvirt runs
//! `sluice --fd=N -o source=DIR`, and sluice serves that directory from the
//! volume itself (its metadata database open in the daemon, no FUSE hop).
//! With `SLUICE_JUICEFS_BIN`, a second `<filesystem>` names a directory of
//! a `juicefs mount` the same way. The guest (Debian's 6.12 cloud kernel,
//! `vm-images/build.sh`) mounts the tags, reads the files the host wrote
//! through the mounts (SHA-256 checked) and writes one back to each; after
//! `virsh destroy` the sluices libvirt started are gone (QEMU's disconnect
//! ends them, as it ends virtiofsd, and so does libvirt's SIGTERM).
//!
//! The libvirtd: the system one when it answers on its socket; otherwise a
//! private root `libvirtd` with its own configuration and client socket
//! under a temporary directory (and a `virtlogd`, which libvirt's QEMU
//! driver logs through, when none runs), stopped when the test ends. The
//! private daemon keeps the test from touching the host's libvirt
//! configuration; its QEMU driver still uses the system's state folders
//! (`/run/libvirt/qemu`, `/var/lib/libvirt/qemu`, `/var/log/libvirt/qemu`),
//! which libvirt does not let a privileged daemon move.
//!
//! Skips (printing why) with `SLUICE_SKIP_VM=1`, without root, or when QEMU
//! or FUSE is missing, as `e2e_vm` does; installs `libvirt-daemon-system`
//! when `libvirtd` is missing (`test.sh` installs it too).

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{SLUICE, Volume, Watchdog, guest_value, hex, sha256_file};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Why this host cannot run the test, if it cannot.
fn missing_prerequisite() -> Option<String> {
    if std::env::var("SLUICE_SKIP_VM").as_deref() == Ok("1") {
        return Some("SLUICE_SKIP_VM=1".into());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("libvirt starts virtio-fs backends only as root (run as root)".into());
    }
    common::vm_prerequisite_missing()
}

/// Installs `libvirt-daemon-system` the way the vm-images scripts install
/// what they miss (`need_command` in vm-images/apt.sh).
fn need_libvirt() {
    let out = Command::new("bash")
        .arg("-c")
        .arg(". vm-images/apt.sh && need_command libvirtd libvirt-daemon-system && need_command virsh libvirt-clients")
        .current_dir(repo())
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "cannot install libvirt-daemon-system: {}",
        common::text(&out)
    );
}

/// A libvirtd to talk to, and the daemons this test started for it.
struct Libvirt {
    uri: String,
    /// Started here (virtlogd, libvirtd): stopped on drop, last first.
    daemons: Vec<Child>,
    dir: PathBuf,
}

impl Libvirt {
    fn virsh(&self, args: &[&str]) -> Output {
        Command::new("virsh")
            .arg("-c")
            .arg(&self.uri)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("virsh runs")
    }

    fn virsh_ok(&self, args: &[&str]) -> String {
        let out = self.virsh(args);
        assert!(
            out.status.success(),
            "virsh {args:?}: {}\n{}",
            common::text(&out),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The private libvirtd's log (errors and warnings), for failures.
    fn log(&self) -> String {
        let log = fs::read_to_string(self.dir.join("libvirtd.log")).unwrap_or_default();
        format!("libvirtd log:\n{log}")
    }

    /// The system libvirtd when it answers, else a private one.
    fn start(dir: &Path) -> Libvirt {
        let system = Libvirt {
            uri: "qemu:///system".into(),
            daemons: Vec::new(),
            dir: dir.to_owned(),
        };
        if Path::new("/run/libvirt/libvirt-sock").exists()
            && system.virsh(&["version"]).status.success()
        {
            eprintln!("using the system libvirtd (qemu:///system)");
            return system;
        }
        let mut daemons = Vec::new();
        // libvirt's QEMU driver sends QEMU's output through virtlogd, at a
        // fixed socket; start one unless one answers there.
        if std::os::unix::net::UnixStream::connect("/run/libvirt/virtlogd-sock").is_err() {
            daemons.push(spawn_logged(
                Command::new("virtlogd")
                    .arg("--pid-file")
                    .arg(dir.join("virtlogd.pid")),
                &dir.join("virtlogd.out"),
            ));
        }
        let run = dir.join("run");
        fs::create_dir_all(&run).unwrap();
        let conf = dir.join("libvirtd.conf");
        fs::write(
            &conf,
            format!(
                "unix_sock_dir = \"{}\"\nunix_sock_rw_perms = \"0700\"\n\
                 auth_unix_rw = \"none\"\nauth_unix_ro = \"none\"\n\
                 log_outputs = \"3:file:{}\"\n",
                run.display(),
                dir.join("libvirtd.log").display()
            ),
        )
        .unwrap();
        daemons.push(spawn_logged(
            Command::new("libvirtd")
                .arg("--config")
                .arg(&conf)
                .arg("--pid-file")
                .arg(dir.join("libvirtd.pid")),
            &dir.join("libvirtd.out"),
        ));
        let libvirt = Libvirt {
            uri: format!(
                "qemu:///system?socket={}",
                run.join("libvirt-sock").display()
            ),
            daemons,
            dir: dir.to_owned(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !libvirt.virsh(&["version"]).status.success() {
            assert!(
                Instant::now() < deadline,
                "the private libvirtd did not answer: {}\n{}",
                fs::read_to_string(dir.join("libvirtd.out")).unwrap_or_default(),
                libvirt.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        eprintln!("started a private libvirtd ({})", libvirt.uri);
        libvirt
    }
}

impl Drop for Libvirt {
    fn drop(&mut self) {
        while let Some(mut d) = self.daemons.pop() {
            // SAFETY: plain kill(2) on a child we started.
            unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(d.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}

fn spawn_logged(cmd: &mut Command, log: &Path) -> Child {
    let f = fs::File::create(log).unwrap();
    cmd.stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// A defined domain: destroyed and undefined on drop.
struct Domain<'a> {
    libvirt: &'a Libvirt,
    name: String,
}

impl Drop for Domain<'_> {
    fn drop(&mut self) {
        let _ = self.libvirt.virsh(&["destroy", &self.name]);
        let _ = self.libvirt.virsh(&["undefine", &self.name]);
    }
}

/// The domain the test starts; `docs/qemu-libvirt.md` ("libvirt starts
/// sluice") shows it with example paths. `@…@` are filled in.
const DOMAIN_XML: &str = "\
<domain type='qemu'>
  <name>@NAME@</name>
  <memory unit='MiB'>512</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>@KERNEL@</kernel>
    <initrd>@INITRD@</initrd>
    <cmdline>console=ttyS0 quiet panic=-1 sluice.tag=data sluice.script=guest.sh sluice.hold=1</cmdline>
  </os>
  <memoryBacking>
    <source type='memfd'/>
    <access mode='shared'/>
  </memoryBacking>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <filesystem type='mount' accessmode='passthrough'>
      <driver type='virtiofs' queue='1024'/>
      <binary path='@SLUICE@'/>
      <source dir='@SOURCE@'/>
      <target dir='data'/>
    </filesystem>
@JUICEFS@    <serial type='file'>
      <source path='@CONSOLE@'/>
      <target port='0'/>
    </serial>
    <memballoon model='none'/>
  </devices>
</domain>
";

/// The second `<filesystem>`: a directory of a JuiceFS mount.
const JUICEFS_FS_XML: &str = "\
    <filesystem type='mount' accessmode='passthrough'>
      <driver type='virtiofs' queue='1024'/>
      <binary path='@SLUICE@'/>
      <source dir='@JFS_SOURCE@'/>
      <target dir='jfs'/>
    </filesystem>
";

const GUEST_SCRIPT: &str = r#"set -e
echo "E2E read $(sha256sum from-host.bin | cut -d' ' -f1)"
head -c 1000001 /dev/urandom >from-guest.bin
echo "E2E wrote $(sha256sum from-guest.bin | cut -d' ' -f1)"
sync
"#;

/// What the guest does with the JuiceFS tag, when there is one.
const GUEST_JUICEFS_SCRIPT: &str = r#"mkdir -p /mnt/jfs
mount -t virtiofs jfs /mnt/jfs
echo "E2E jfsread $(sha256sum /mnt/jfs/from-host.bin | cut -d' ' -f1)"
head -c 500001 /dev/urandom >/mnt/jfs/from-guest.bin
echo "E2E jfswrote $(sha256sum /mnt/jfs/from-guest.bin | cut -d' ' -f1)"
sync
"#;

/// A foreground `juicefs mount` (of a volume it formats), unmounted, or
/// killed, on drop.
struct JuicefsMount {
    bin: PathBuf,
    path: PathBuf,
    child: Option<Child>,
    database: PathBuf,
}

impl JuicefsMount {
    /// Formats a SQLite + local-directory volume in `dir` and mounts it on
    /// `dir/jfs`.
    fn start(bin: &Path, dir: &Path) -> JuicefsMount {
        let database = dir.join("jfs.db");
        let meta_url = format!("sqlite3://{}", database.display());
        let out = Command::new(bin)
            .args([
                "format",
                &meta_url,
                "libvirtjfs",
                "--storage",
                "file",
                "--bucket",
            ])
            .arg(format!("{}/", dir.join("bucket").display()))
            .output()
            .expect("juicefs runs");
        assert!(
            out.status.success(),
            "juicefs format: {}",
            common::text(&out)
        );
        let path = dir.join("jfs");
        fs::create_dir_all(&path).unwrap();
        let child = Command::new(bin)
            .args(["mount", &meta_url])
            .arg(&path)
            .arg("--cache-dir")
            .arg(dir.join("cache"))
            .args([
                "--no-usage-report",
                "--no-bgjob",
                "--attr-cache=0",
                "--entry-cache=0",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("juicefs mount starts");
        let mut m = JuicefsMount {
            bin: bin.to_owned(),
            path,
            child: Some(child),
            database,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while common::mount_type(&m.path).as_deref() != Some("fuse.juicefs") {
            if let Some(s) = m.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("juicefs mount exited ({s}) before mounting");
            }
            assert!(Instant::now() < deadline, "juicefs did not mount in 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        m
    }
}

impl Drop for JuicefsMount {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new(&self.bin)
                .arg("umount")
                .arg(&self.path)
                .output();
            let deadline = Instant::now() + Duration::from_secs(20);
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            common::lazy_unmount(&self.path);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Whether process `pid` holds `file` open.
fn holds_open(pid: u32, file: &Path) -> bool {
    let file = fs::canonicalize(file).unwrap();
    fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .any(|e| fs::read_link(e.path()).is_ok_and(|l| l == file))
        })
        .unwrap_or(false)
}

/// Live processes (not zombies) whose command line has `needle` as one argument.
fn processes_with_arg(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let has = cmdline
            .split(|&b| b == 0)
            .any(|arg| arg == needle.as_bytes());
        let zombie = fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(") ")
                    .map(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X'))
            })
            .unwrap_or(true);
        if has && !zombie {
            out.push(pid);
        }
    }
    out
}

#[test]
fn libvirt_starts_and_stops_sluice_as_the_virtiofs_backend() {
    if let Some(why) = missing_prerequisite() {
        eprintln!("skipped: {why}");
        return;
    }
    let _dog = Watchdog::new("e2e_libvirt", Duration::from_secs(900));
    let test_start = Instant::now();
    need_libvirt();
    common::build_guest();

    let vol = Volume::format("libvirt", &["--trash-days", "0"]);
    let host_mnt = vol.dir.path().join("host");
    fs::create_dir(&host_mnt).unwrap();
    let host = common::Mount::start(
        &vol.meta_url,
        &host_mnt,
        &vol.dir.path().join("host.log"),
        &["--attr-cache", "0", "--entry-cache", "0"],
    );
    let mut state = common::seed("e2e_libvirt") | 1;
    let mut input = vec![0u8; (1 << 20) + 1];
    for chunk in input.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
    // libvirt's <source dir=…>: a directory of the sluice mount.
    let source = host_mnt.join("guests/vm1");
    fs::create_dir_all(&source).unwrap();
    fs::write(source.join("from-host.bin"), &input).unwrap();
    let input_sha = hex(&sha256_file(&source.join("from-host.bin")));
    // And, with JuiceFS, one of a juicefs mount.
    let jfs_dir = tempfile::tempdir().unwrap();
    let jfs = match std::env::var_os("SLUICE_JUICEFS_BIN") {
        Some(bin) => Some(JuicefsMount::start(Path::new(&bin), jfs_dir.path())),
        None => {
            eprintln!("no JuiceFS filesystem: SLUICE_JUICEFS_BIN is not set");
            None
        }
    };
    let jfs_source = jfs.as_ref().map(|j| j.path.join("guests/vm1"));
    let mut jfs_input_sha = None;
    if let Some(dir) = &jfs_source {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join("from-host.bin"), &input[..300_007]).unwrap();
        jfs_input_sha = Some(hex(&sha256_file(&dir.join("from-host.bin"))));
    }
    let script = if jfs.is_some() {
        format!("{GUEST_SCRIPT}{GUEST_JUICEFS_SCRIPT}echo \"E2E done\"\n")
    } else {
        format!("{GUEST_SCRIPT}echo \"E2E done\"\n")
    };
    fs::write(source.join("guest.sh"), script).unwrap();

    // QEMU runs as libvirt's qemu user: the kernel, the initramfs and the
    // console file live in a folder it may enter.
    let vm_dir = tempfile::tempdir().unwrap();
    fs::set_permissions(vm_dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let out = repo().join("vm-images/out");
    let kernel_src = if out.join("vmlinux").exists() {
        out.join("vmlinux")
    } else {
        out.join("vmlinuz")
    };
    let kernel = vm_dir.path().join("kernel");
    let initrd = vm_dir.path().join("initramfs.cpio.gz");
    fs::copy(&kernel_src, &kernel).unwrap();
    fs::copy(out.join("initramfs.cpio.gz"), &initrd).unwrap();
    let console_log = vm_dir.path().join("console.log");

    let libvirt_dir = tempfile::tempdir().unwrap();
    let libvirt = Libvirt::start(libvirt_dir.path());
    eprintln!("libvirtd answers at +{:?}", test_start.elapsed());
    let name = format!("sluice-e2e-{}", std::process::id());
    let xml = DOMAIN_XML
        .replace("@NAME@", &name)
        .replace("@KERNEL@", &kernel.display().to_string())
        .replace("@INITRD@", &initrd.display().to_string())
        .replace(
            "@JUICEFS@",
            &jfs_source
                .as_ref()
                .map(|d| JUICEFS_FS_XML.replace("@JFS_SOURCE@", &d.display().to_string()))
                .unwrap_or_default(),
        )
        .replace("@SLUICE@", SLUICE)
        .replace("@SOURCE@", &source.display().to_string())
        .replace("@CONSOLE@", &console_log.display().to_string());
    let xml_path = vm_dir.path().join("domain.xml");
    fs::write(&xml_path, &xml).unwrap();
    libvirt.virsh_ok(&["define", &xml_path.display().to_string()]);
    let domain = Domain {
        libvirt: &libvirt,
        name: name.clone(),
    };
    let started = Instant::now();
    libvirt.virsh_ok(&["start", &name]);
    let backend_log = PathBuf::from(format!("/var/log/libvirt/qemu/{name}-fs0-virtiofsd.log"));
    let logs = || {
        format!(
            "console:\n{}\nsluice (libvirt's virtiofsd log {}):\n{}\n{}",
            fs::read_to_string(&console_log).unwrap_or_default(),
            backend_log.display(),
            fs::read_to_string(&backend_log).unwrap_or_default(),
            libvirt.log()
        )
    };

    // The sluice libvirt started: `sluice --fd=N -o source=DIR`.
    let source_arg = format!("source={}", source.display());
    let backends = processes_with_arg(&source_arg);
    assert_eq!(
        backends.len(),
        1,
        "one sluice backend while the domain runs: {backends:?}\n{}",
        logs()
    );
    let backend = backends[0];
    let exe = fs::read_link(format!("/proc/{backend}/exe")).unwrap();
    assert_eq!(
        exe,
        fs::canonicalize(SLUICE).unwrap(),
        "the backend's program"
    );
    let jfs_arg = jfs_source
        .as_ref()
        .map(|d| format!("source={}", d.display()));
    let jfs_backend = jfs_arg.as_ref().map(|arg| {
        let found = processes_with_arg(arg);
        assert_eq!(found.len(), 1, "one JuiceFS backend: {found:?}\n{}", logs());
        found[0]
    });

    // The guest holds after its script (sluice.hold=1), so the VM is up
    // until libvirt destroys it.
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let console = fs::read_to_string(&console_log).unwrap_or_default();
        if console.contains("SLUICE-GUEST-HOLD") {
            break;
        }
        let state = libvirt.virsh_ok(&["domstate", &name]);
        assert!(
            state.trim() == "running" && Instant::now() < deadline,
            "the guest did not finish its script (domain {}): {}",
            state.trim(),
            logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!(
        "guest done {:?} after virsh start (+{:?})",
        started.elapsed(),
        test_start.elapsed()
    );
    let console = fs::read_to_string(&console_log).unwrap_or_default();
    // QEMU set up one request queue (its default) of the 16 sluice offers.
    assert!(
        console.contains("tag=data request_queues=1"),
        "the guest saw no virtio-fs tag 'data' with one request queue: {}",
        logs()
    );
    assert!(
        console.contains("SLUICE-GUEST-EXIT rc=0"),
        "the guest script failed: {}",
        logs()
    );
    assert_eq!(
        guest_value(&console, "read").as_deref(),
        Some(input_sha.as_str()),
        "from-host.bin's SHA-256 in the guest"
    );
    assert!(
        processes_with_arg(&source_arg).contains(&backend),
        "sluice left while the domain runs: {}",
        logs()
    );
    // Each backend serves from the volume itself: it holds the metadata
    // database open.
    assert!(
        holds_open(backend, &vol.dir.path().join("meta.db")),
        "the backend does not hold the volume's database: {}",
        logs()
    );
    if let (Some(jfs), Some(pid)) = (&jfs, jfs_backend) {
        assert!(
            holds_open(pid, &jfs.database),
            "the JuiceFS backend does not hold the volume's database: {}",
            logs()
        );
        assert_eq!(
            guest_value(&console, "jfsread"),
            jfs_input_sha,
            "the JuiceFS directory's from-host.bin SHA-256 in the guest: {}",
            logs()
        );
    }

    // libvirt stops what it started.
    libvirt.virsh_ok(&["destroy", &name]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while processes_with_arg(&source_arg).contains(&backend) {
        assert!(
            Instant::now() < deadline,
            "sluice (pid {backend}) still runs after virsh destroy: {}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(libvirt.virsh_ok(&["domstate", &name]).trim(), "shut off");
    let backend_text = fs::read_to_string(&backend_log).unwrap_or_default();
    assert!(
        backend_text.contains("started as a virtio-fs backend")
            && backend_text.contains("Waiting for vhost-user socket connection"),
        "sluice's log (libvirt's virtiofsd log) lacks its start or readiness line: {}",
        logs()
    );

    // What the guest wrote, as the host sees it through the mounts.
    let wrote = guest_value(&console, "wrote").expect("the guest's E2E wrote line");
    assert_eq!(
        hex(&sha256_file(&source.join("from-guest.bin"))),
        wrote,
        "from-guest.bin's SHA-256 on the host"
    );
    assert_eq!(
        fs::metadata(source.join("from-guest.bin")).unwrap().len(),
        1_000_001
    );
    if let Some(dir) = &jfs_source {
        let wrote = guest_value(&console, "jfswrote").expect("the guest's E2E jfswrote line");
        assert_eq!(
            hex(&sha256_file(&dir.join("from-guest.bin"))),
            wrote,
            "the JuiceFS directory's from-guest.bin SHA-256 through juicefs mount"
        );
    }
    drop(domain);
    drop(jfs);
    host.unmount();
    eprintln!("checked at +{:?}", test_start.elapsed());
}

/// What libvirt and packagers read without starting a VM: the capabilities
/// a backend prints, and the descriptor `install-libvirt` writes.
#[test]
fn capabilities_and_descriptor() {
    let out = common::sluice(&["--print-capabilities"]);
    assert!(out.status.success(), "{}", common::text(&out));
    let caps: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(caps["type"], "fs");
    // libvirt's vhost-user parser (qemu_vhost_user.c) reads "features" as
    // an array of strings and acts on "separate-options" (then it passes
    // `--shared-dir DIR --cache …`, which sluice takes) and
    // "migrate-precopy" (which sluice cannot do, so does not list).
    let features: Vec<&str> = caps["features"]
        .as_array()
        .expect("a features array")
        .iter()
        .map(|f| f.as_str().expect("features are strings"))
        .collect();
    assert_eq!(features, ["separate-options"]);

    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("vhost-user");
    let dir_s = target.display().to_string();
    common::sluice_ok(&[
        "install-libvirt",
        "--dir",
        &dir_s,
        "--binary",
        "/usr/bin/sluice",
    ]);
    let written = fs::read_to_string(target.join("90-sluice.json")).unwrap();
    assert_eq!(
        written,
        fs::read_to_string(repo().join("packaging/vhost-user/90-sluice.json")).unwrap(),
        "install-libvirt writes the packaged descriptor"
    );
    // Without --binary it names the running program.
    common::sluice_ok(&["install-libvirt", "--dir", &dir_s]);
    let doc: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(target.join("90-sluice.json")).unwrap()).unwrap();
    assert_eq!(doc["binary"], SLUICE);

    // virtiofsd's own way to start (`--socket-path`, `--shared-dir`), with
    // the settings file named directly: sluice creates the socket and
    // serves until SIGTERM.
    let vol = Volume::format("socketpath", &[]);
    let env = vol.dir.path().join("vm2.env");
    fs::write(
        &env,
        format!(
            "# as the systemd units' env files (systemd's EnvironmentFile= format)\n\
             META_URL='{}'\nSOCKET=/unused\nSLUICE_ARGS=\"--no-metrics --queues 2\"\n\
             META_PASSWORD=\nRUST_LOG=info\n",
            vol.meta_url
        ),
    )
    .unwrap();
    let socket = vol.dir.path().join("vm2.sock");
    let log = vol.dir.path().join("vm2.log");
    let mut child = spawn_logged(
        Command::new(SLUICE)
            .arg(format!("--socket-path={}", socket.display()))
            .arg("--shared-dir")
            .arg(&env)
            .args(["--cache", "auto", "--thread-pool-size=4"])
            .env("RUST_LOG", "info"),
        &log,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !socket.exists() {
        let exited = child.try_wait().unwrap();
        assert!(
            exited.is_none() && Instant::now() < deadline,
            "no socket from --socket-path ({exited:?}): {}",
            fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: plain kill(2) on a child we started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let text = fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "{status}: {text}");
    assert!(
        text.contains("--thread-pool-size=4 has no effect"),
        "ignored options are logged: {text}"
    );

    // A virtiofsd option sluice does not know stops the start, by name.
    let out = common::sluice(&["--fd=3", "-o", "source=/nonexistent,frobnicate"]);
    assert!(!out.status.success());
    assert!(
        common::text(&out).contains("-o frobnicate"),
        "{}",
        common::text(&out)
    );
}
