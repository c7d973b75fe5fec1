//! Round trips through both backends on real files.

use std::io::Write as _;
use std::path::PathBuf;

use super::*;
use crate::memory::PageSize;

/// The backends this host can run: always the pool, and io_uring where it sets up. Where it
/// does not (qemu-user, io_uring_disabled), Auto must have fallen back and said why.
fn backends() -> Vec<BackendChoice> {
    let mut out = vec![BackendChoice::Threads];
    let auto = Reactor::<()>::new(&ReactorConfig::default()).unwrap();
    match Reactor::<()>::new(&config(BackendChoice::Uring)) {
        Ok(r) => {
            assert_eq!(r.backend(), BackendKind::Uring);
            assert_eq!(auto.backend(), BackendKind::Uring);
            out.push(BackendChoice::Uring);
        }
        Err(e) => {
            assert!(matches!(e, ReactorError::UringUnavailable { .. }), "{e}");
            assert_eq!(auto.backend(), BackendKind::Threads);
            assert!(auto.describe_backend().contains("io_uring unavailable"));
        }
    }
    out
}

fn config(backend: BackendChoice) -> ReactorConfig {
    ReactorConfig {
        backend,
        max_piece: 64 << 10,
        ..ReactorConfig::default()
    }
}

/// A directory on a file system with O_DIRECT (the temp dir unless it is tmpfs).
fn direct_dir() -> tempfile::TempDir {
    for base in [std::env::temp_dir(), PathBuf::from("/var/tmp")] {
        let dir = tempfile::tempdir_in(&base).unwrap();
        match open_direct(&dir.path().join("probe"), true) {
            Ok(_) => return dir,
            Err(DirectError::Unsupported { .. }) => continue,
            Err(e) => panic!("{e}"),
        }
    }
    panic!("no O_DIRECT-capable directory in the temp dir or /var/tmp")
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn wait_for(reactor: &mut Reactor, n: usize) -> Vec<Completion> {
    let mut events = Vec::new();
    while events.len() < n {
        reactor.wait(&mut events).unwrap();
    }
    events
        .into_iter()
        .map(|e| match e {
            Event::Io(c) => c,
            Event::Message(()) => panic!("unexpected message"),
        })
        .collect()
}

#[test]
fn fixed_buffer_round_trip_on_a_buffered_file() {
    for backend in backends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let mut r = Reactor::<()>::new(&config(backend)).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let slot = r.register_file(file).unwrap();
        assert_eq!(r.file_direct_align(slot).unwrap(), None);
        let src = r
            .register_buffer(NodeBuffer::new(100_000, Some(0), PageSize::Normal).unwrap())
            .unwrap();
        let dst = r
            .register_buffer(NodeBuffer::new(100_000, None, PageSize::Normal).unwrap())
            .unwrap();
        let data = pattern(100_000, 3);
        r.buffer_mut(src).unwrap().copy_from_slice(&data);
        // Two writes batched in one submission, at unaligned offsets.
        r.write_fixed(1, slot, 7, src, 0, 50_000).unwrap();
        r.write_fixed(2, slot, 50_007, src, 50_000, 50_000).unwrap();
        assert_eq!(r.in_flight(), 2);
        assert!(matches!(
            r.unregister_buffer(src),
            Err(ReactorError::Busy { .. })
        ));
        let mut done = wait_for(&mut r, 2);
        done.sort_by_key(|c| c.token);
        for c in &done {
            assert_eq!(*c.result.as_ref().unwrap(), 50_000, "{backend:?}");
        }
        r.read_fixed(9, slot, 7, dst, 0, 100_000).unwrap();
        let done = wait_for(&mut r, 1);
        assert_eq!(done[0].token, 9);
        assert_eq!(*done[0].result.as_ref().unwrap(), 100_000);
        assert!(r.buffer(dst).unwrap() == data.as_slice(), "{backend:?}");
        assert_eq!(std::fs::read(&path).unwrap()[7..], data[..]);
        // Reading past the end is a short read, not an error.
        r.read_fixed(10, slot, 100_000, dst, 0, 4096).unwrap();
        assert_eq!(*wait_for(&mut r, 1)[0].result.as_ref().unwrap(), 7);
        let back = r.unregister_buffer(dst).unwrap().unwrap();
        assert_eq!(back.len(), 100_000);
        r.unregister_file(slot).unwrap();
    }
}

#[test]
fn o_direct_round_trip_and_alignment_errors() {
    for backend in backends() {
        let dir = direct_dir();
        let path = dir.path().join("direct");
        let mut r = Reactor::<()>::new(&config(backend)).unwrap();
        let slot = r.register_file(open_direct(&path, true).unwrap()).unwrap();
        let align = r.file_direct_align(slot).unwrap().unwrap();
        let block = align.offset as usize;
        let buf = r
            .register_buffer(NodeBuffer::new(1 << 20, Some(0), PageSize::HugeIfAvailable).unwrap())
            .unwrap();
        let data = pattern(1 << 20, 11);
        r.buffer_mut(buf).unwrap().copy_from_slice(&data);
        r.write_fixed(1, slot, 0, buf, 0, 1 << 20).unwrap();
        assert_eq!(*wait_for(&mut r, 1)[0].result.as_ref().unwrap(), 1 << 20);
        r.buffer_mut(buf).unwrap().fill(0);
        // Scattered 4 KiB reads back into place, all in one batch.
        for (i, at) in (0..(1 << 20)).step_by(4096).enumerate() {
            r.read_fixed(i as u64, slot, at as u64, buf, at, 4096)
                .unwrap();
        }
        let done = wait_for(&mut r, 256);
        assert!(done.iter().all(|c| *c.result.as_ref().unwrap() == 4096));
        assert!(r.buffer(buf).unwrap() == data.as_slice(), "{backend:?}");
        let err = r.read_fixed(1, slot, 1, buf, 0, block).unwrap_err();
        assert!(matches!(err, ReactorError::Misaligned { .. }), "{err}");
        assert!(err.to_string().contains("must be aligned"));
        assert!(r.read_fixed(1, slot, 0, buf, 1, block).is_err());
        assert!(r.read_fixed(1, slot, 0, buf, 0, block + 1).is_err());
        assert_eq!(r.in_flight(), 0);
    }
}

#[test]
fn guest_regions_split_into_pieces_and_are_replaced() {
    for backend in backends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blocks");
        let data = pattern(256 << 10, 5);
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&data)
            .unwrap();
        let mut r = Reactor::<()>::new(&config(backend)).unwrap();
        let slot = r
            .register_file(std::fs::File::open(&path).unwrap())
            .unwrap();
        // Stand-in for guest RAM: memory the reactor does not own.
        let mut guest = vec![0u8; 200 << 10];
        // SAFETY: `guest` outlives every use: the region is replaced below before it is
        // dropped, and it is only read after the I/O completed.
        let region = unsafe { r.register_region(guest.as_mut_ptr(), guest.len()) }.unwrap();
        assert_eq!(region.pieces().len(), 4);
        assert_eq!(region.pieces()[3].len, (200 - 192) << 10);
        assert_eq!(
            region.locate(64 << 10, 10),
            Some((region.pieces()[1].buffer, 0))
        );
        assert_eq!(region.locate((64 << 10) - 5, 10), None);
        assert_eq!(region.locate(200 << 10, 1), None);
        // A "FUSE_READ" into guest address 70000: buffer index + offset.
        let (buf, off) = region.locate(70_000, 1000).unwrap();
        r.read_fixed(1, slot, 5000, buf, off, 1000).unwrap();
        assert_eq!(*wait_for(&mut r, 1)[0].result.as_ref().unwrap(), 1000);
        let err = r.read_fixed(1, slot, 0, buf, off, 64 << 10).unwrap_err();
        assert!(matches!(err, ReactorError::OutOfBounds { .. }), "{err}");
        assert_eq!(guest[70_000..71_000], data[5000..6000]);

        // The guest's memory table changes: a new region replaces the old one.
        let mut guest2 = vec![0u8; 64 << 10];
        let mut events = Vec::new();
        // SAFETY: as above; `guest` is no longer registered after this call.
        let regions =
            unsafe { r.replace_regions(&[(guest2.as_mut_ptr(), guest2.len())], &mut events) }
                .unwrap();
        assert_eq!(regions.len(), 1);
        assert_eq!(regions[0].pieces().len(), 1);
        drop(guest);
        let (buf, off) = regions[0].locate(100, 4000).unwrap();
        r.read_fixed(2, slot, 0, buf, off, 4000).unwrap();
        assert_eq!(*wait_for(&mut r, 1)[0].result.as_ref().unwrap(), 4000);
        assert_eq!(guest2[100..4100], data[..4000]);
        r.unregister_region(&regions[0]).unwrap();
        assert!(r.read_fixed(3, slot, 0, buf, 0, 1).is_err());
        // SAFETY: null is rejected before anything is registered.
        let err = unsafe { r.register_region(std::ptr::null_mut(), 10) }.unwrap_err();
        assert!(matches!(err, ReactorError::EmptyRegion));
    }
}

#[test]
fn io_errors_come_back_as_completions() {
    for backend in backends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wo");
        let mut r = Reactor::<()>::new(&config(backend)).unwrap();
        let slot = r
            .register_file(std::fs::File::create(&path).unwrap())
            .unwrap();
        let buf = r
            .register_buffer(NodeBuffer::new(4096, None, PageSize::Normal).unwrap())
            .unwrap();
        r.read_fixed(5, slot, 0, buf, 0, 4096).unwrap();
        let done = wait_for(&mut r, 1);
        let err = done[0].result.as_ref().unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF), "{backend:?}");
        assert!(matches!(
            r.read_fixed(5, FileSlot(60), 0, buf, 0, 1),
            Err(ReactorError::NotRegistered { table: "file", .. })
        ));
        assert!(matches!(
            r.read_fixed(5, slot, 0, BufferId(200), 0, 1),
            Err(ReactorError::NotRegistered {
                table: "buffer",
                ..
            })
        ));
    }
}

#[test]
fn tables_report_when_full() {
    for backend in backends() {
        let mut r = Reactor::<()>::new(&ReactorConfig {
            max_files: 1,
            max_buffers: 1,
            ..config(backend)
        })
        .unwrap();
        r.register_file(std::fs::File::open("/dev/null").unwrap())
            .unwrap();
        let err = r
            .register_file(std::fs::File::open("/dev/null").unwrap())
            .unwrap_err();
        assert!(
            err.to_string().contains("all 1 file slots are in use"),
            "{err}"
        );
        r.register_buffer(NodeBuffer::new(4096, None, PageSize::Normal).unwrap())
            .unwrap();
        assert!(matches!(
            r.register_buffer(NodeBuffer::new(4096, None, PageSize::Normal).unwrap()),
            Err(ReactorError::TableFull { .. })
        ));
    }
}

#[test]
fn messages_from_other_threads_wake_a_pinned_reactor() {
    for backend in backends() {
        let cpu = crate::pinning::allowed_cpus().unwrap().as_slice()[0];
        let (thread, handle) = Reactor::<u32>::spawn(
            "reactor-test".into(),
            Some(cpu),
            config(backend),
            move |mut r| {
                let on_cpu = crate::pinning::current_cpu();
                let mut got = Vec::new();
                let mut events = Vec::new();
                loop {
                    events.clear();
                    r.wait(&mut events).unwrap();
                    for e in events.drain(..) {
                        match e {
                            Event::Message(u32::MAX) => return (on_cpu, got, r.backend()),
                            Event::Message(m) => got.push(m),
                            Event::Io(c) => panic!("no I/O was queued: {c:?}"),
                        }
                    }
                }
            },
        )
        .unwrap();
        let senders: Vec<_> = (0..4u32)
            .map(|t| {
                let h = handle.clone();
                std::thread::spawn(move || {
                    for i in 0..250 {
                        // Give the reactor time to block between some messages.
                        if i % 50 == 0 {
                            std::thread::sleep(std::time::Duration::from_millis(2));
                        }
                        h.send(t * 1000 + i).unwrap();
                    }
                })
            })
            .collect();
        for s in senders {
            s.join().unwrap();
        }
        handle.send(u32::MAX).unwrap();
        let (on_cpu, mut got, kind) = thread.join().unwrap().unwrap();
        assert_eq!(on_cpu, Some(cpu));
        got.sort_unstable();
        let want: Vec<u32> = (0..4)
            .flat_map(|t| (0..250).map(move |i| t * 1000 + i))
            .collect();
        assert_eq!(got, want, "{backend:?}");
        let expect = match backend {
            BackendChoice::Threads => BackendKind::Threads,
            _ => BackendKind::Uring,
        };
        assert_eq!(kind, expect);
        assert!(handle.send(1).is_err());
    }
}

#[test]
fn backend_names_parse() {
    assert_eq!(BackendChoice::parse(None).unwrap(), BackendChoice::Auto);
    assert_eq!(
        BackendChoice::parse(Some("uring")).unwrap(),
        BackendChoice::Uring
    );
    assert_eq!(
        BackendChoice::parse(Some("threads")).unwrap(),
        BackendChoice::Threads
    );
    let err = BackendChoice::parse(Some("epoll")).unwrap_err();
    assert!(
        err.to_string().contains("SLUICE_IO_BACKEND must be"),
        "{err}"
    );
}

/// A thread that sleeps in `poll(2)`, not in the ring, learns of completions through a
/// registered eventfd and collects them with `Reactor::poll`, which never blocks — on a
/// DEFER_TASKRUN ring too, where the completion is not posted until this thread asks.
#[test]
fn a_registered_eventfd_wakes_a_thread_that_polls_for_completions() {
    if !backends().contains(&BackendChoice::Uring) {
        return;
    }
    let dir = direct_dir();
    let path = dir.path().join("evented");
    let data = pattern(1 << 20, 9);
    std::fs::write(&path, &data).unwrap();
    let mut r = Reactor::<()>::new(&config(BackendChoice::Uring)).unwrap();
    // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
    let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: `raw` is a fresh descriptor this test owns.
    let event = unsafe { OwnedFd::from_raw_fd(raw) };
    r.register_eventfd(event.as_raw_fd()).unwrap();
    let slot = r.register_file(open_direct(&path, false).unwrap()).unwrap();
    let buf = r
        .register_buffer(NodeBuffer::new(1 << 20, None, PageSize::Normal).unwrap())
        .unwrap();
    let mut events = Vec::new();
    // Nothing queued: poll returns at once with nothing.
    assert_eq!(r.poll(&mut events).unwrap(), 0);
    for (i, at) in (0..(1 << 20)).step_by(128 << 10).enumerate() {
        r.read_fixed(i as u64, slot, at as u64, buf, at, 128 << 10)
            .unwrap();
    }
    r.submit().unwrap();
    let mut got = 0;
    while got < 8 {
        let mut fds = [libc::pollfd {
            fd: event.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: one live pollfd. A lost wake-up fails the test by its 10 s timeout.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 1, 10_000) };
        assert_eq!(ready, 1, "the eventfd was not signalled");
        let mut counter = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from a nonblocking eventfd.
        unsafe { libc::read(event.as_raw_fd(), (&raw mut counter).cast(), 8) };
        got += r.poll(&mut events).unwrap();
    }
    assert_eq!(r.in_flight(), 0);
    for e in &events {
        let Event::Io(c) = e else {
            panic!("unexpected message")
        };
        assert_eq!(*c.result.as_ref().unwrap(), 128 << 10);
    }
    assert!(r.buffer(buf).unwrap() == data.as_slice());
}
