//! A device's descriptors are all closed when its connection ends: a
//! daemon whose VMs reconnect again and again never runs out of them.
//! (vhost-user-backend leaks each worker's exit-event consumer; the device
//! closes them itself: `sluice_vhost` backend.rs, `close_exit_consumers`.)
//! Its own test binary, so no other test opens descriptors meanwhile.

use std::io::Write;
use std::sync::Arc;

use sluice_benches::virtiofs::{Device, DeviceOptions, FuseQueue, HarnessError};
use sluice_vhost::{DeviceConfig, RequestHandler, VirtioFsDevice, WriteSource, Writer, frame};

/// Answers every request with ENOSYS.
struct Enosys;

impl RequestHandler for Enosys {
    fn handle(
        &self,
        _queue: u16,
        request: &[u8],
        _data: &mut dyn WriteSource,
        reply: &mut Writer<'_>,
    ) -> std::io::Result<()> {
        let header = frame::InHeader::parse(request).expect("device checked the header");
        reply.write_all(&frame::error_reply(libc::ENOSYS, header.unique))
    }
}

/// The descriptors this process has open, by what they point at.
fn open_descriptors() -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|target| target.to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// One device, one connection with a request on each queue, then the
/// frontend goes away and the device's thread ends.
fn connect_once(queues: usize) {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("fs.sock");
    let mut listener = sluice_vhost::listen(&socket, None).expect("listen");
    let mut config = DeviceConfig::new("reconnect", queues);
    config.queue_size = 64;
    let device = VirtioFsDevice::new(config, Arc::new(Enosys)).expect("device");
    let server = std::thread::spawn(move || device.serve(&mut listener));
    let mut driver = Device::connect(
        &socket,
        DeviceOptions {
            request_queues: queues,
            queue_size: 64,
            memory_size: 4 << 20,
        },
    )
    .expect("connect");
    for q in 1..=queues {
        let mut queue = FuseQueue::new(&mut driver, q, 64 << 10).expect("queue");
        match queue.getattr(1) {
            Err(HarnessError::Errno { errno, .. }) => assert_eq!(errno, libc::ENOSYS),
            other => panic!("queue {q}: {other:?}"),
        }
    }
    drop(driver);
    server
        .join()
        .expect("the device thread did not panic")
        .expect("the device ended the connection cleanly");
}

#[test]
fn connections_leave_no_descriptor_behind() {
    // The first connection sets up what lives for the process (the log,
    // thread-local rings): count from after it.
    connect_once(2);
    let before = open_descriptors();
    for queues in [1, 2, 4, 1, 2, 4, 3, 3] {
        connect_once(queues);
    }
    let after = open_descriptors();
    assert_eq!(
        after, before,
        "descriptors left open by 8 connections (before, then after)"
    );
}
