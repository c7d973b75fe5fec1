//! `SLUICE_IO_BACKEND=threads` forces the pread/pwrite pool. Its own test binary (one test)
//! because it sets an environment variable.

use std::io::Write as _;

use sluice_numa::reactor::{BackendKind, Event, ReactorConfig, ReactorError};
use sluice_numa::{NodeBuffer, PageSize, Reactor};

#[test]
fn environment_variable_forces_the_thread_pool() {
    // SAFETY: this binary's only test; no other thread reads the environment concurrently.
    unsafe { std::env::set_var("SLUICE_IO_BACKEND", "threads") };
    let mut r = Reactor::<()>::new(&ReactorConfig::from_env().unwrap()).unwrap();
    assert_eq!(r.backend(), BackendKind::Threads);
    assert_eq!(
        r.describe_backend(),
        "pread/pwrite thread pool (4 threads): requested"
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    std::fs::File::create(&path)
        .unwrap()
        .write_all(b"hello, fallback")
        .unwrap();
    let slot = r
        .register_file(std::fs::File::open(&path).unwrap())
        .unwrap();
    let buf = r
        .register_buffer(NodeBuffer::new(4096, None, PageSize::Normal).unwrap())
        .unwrap();
    r.read_fixed(42, slot, 7, buf, 0, 8).unwrap();
    let mut events = Vec::new();
    r.wait(&mut events).unwrap();
    match &events[0] {
        Event::Io(c) => {
            assert_eq!(c.token, 42);
            assert_eq!(*c.result.as_ref().unwrap(), 8);
        }
        Event::Message(()) => panic!("no message was sent"),
    }
    assert_eq!(&r.buffer(buf).unwrap()[..8], b"fallback");

    // SAFETY: as above.
    unsafe { std::env::set_var("SLUICE_IO_BACKEND", "bogus") };
    let err = ReactorConfig::from_env().unwrap_err();
    assert!(matches!(err, ReactorError::BadBackendName(_)), "{err}");
    // SAFETY: as above.
    unsafe { std::env::remove_var("SLUICE_IO_BACKEND") };
}
