//! Many requests in flight on several request queues of the sluice virtio-fs
//! device at once, from several driver threads: every reply lands in the
//! chain of its own request, none is lost, none is duplicated.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sluice_benches::virtiofs::wire::{self, IN_HEADER_LEN, OUT_HEADER_LEN};
use sluice_benches::virtiofs::{Device, DeviceOptions, REQUEST_TIMEOUT};
use sluice_vhost::{DeviceConfig, RequestHandler, VirtioFsDevice, WriteSource, Writer, frame};
use vm_memory::{Bytes, GuestAddress};

/// Echoes each request's argument bytes back after a success header, and
/// counts requests per queue, so the driver can check where each reply went.
#[derive(Debug, Default)]
struct EchoHandler {
    per_queue: [AtomicUsize; 4],
}

impl RequestHandler for EchoHandler {
    fn handle(
        &self,
        queue: u16,
        request: &[u8],
        _data: &mut dyn WriteSource,
        reply: &mut Writer<'_>,
    ) -> std::io::Result<()> {
        self.per_queue[usize::from(queue)].fetch_add(1, Ordering::SeqCst);
        let header = frame::InHeader::parse(request).expect("device checked the header");
        let args = &request[IN_HEADER_LEN..];
        let len = (OUT_HEADER_LEN + args.len()) as u32;
        reply.write_all(&frame::out_header(len, 0, header.unique))?;
        reply.write_all(args)
    }
}

const QUEUES: usize = 3;
const DEPTH: usize = 32;
const REQUESTS_PER_QUEUE: u64 = 3000;

#[test]
fn replies_match_requests_across_queues() {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("fs.sock");
    let mut listener = sluice_vhost::listen(&socket, None).expect("listen");
    let mut config = DeviceConfig::new("queues", QUEUES);
    config.queue_size = 256;
    let handler = Arc::new(EchoHandler::default());
    let device = VirtioFsDevice::new(config, handler.clone()).expect("device");
    let server = std::thread::spawn(move || device.serve(&mut listener));

    let mut driver = Device::connect(
        &socket,
        DeviceOptions {
            request_queues: QUEUES,
            queue_size: 256,
            memory_size: 16 << 20,
        },
    )
    .expect("connect");
    let mem = driver.memory().memory().clone();
    let mut threads = Vec::new();
    for index in 1..=QUEUES {
        let mut queue = driver.take_queue(index).expect("queue");
        let buffers: Vec<(GuestAddress, GuestAddress)> = (0..DEPTH)
            .map(|_| (driver.alloc(256).unwrap(), driver.alloc(256).unwrap()))
            .collect();
        let mem = mem.clone();
        threads.push(std::thread::spawn(move || {
            let mut in_flight: HashMap<u16, (usize, u64)> = HashMap::new();
            let mut next = 0u64;
            let mut done = 0u64;
            let mut free: Vec<usize> = (0..DEPTH).collect();
            let deadline = std::time::Instant::now() + REQUEST_TIMEOUT;
            while done < REQUESTS_PER_QUEUE {
                while next < REQUESTS_PER_QUEUE {
                    let Some(slot) = free.pop() else { break };
                    let unique = ((index as u64) << 32) | next;
                    let args = unique.to_le_bytes().repeat(1 + (next % 7) as usize);
                    let request = wire::request(9999, unique, 1, &args);
                    let (req, rep) = buffers[slot];
                    mem.write_slice(&request, req).unwrap();
                    let head = queue
                        .add(
                            &[(req, request.len() as u32)],
                            &[(rep, 8), (GuestAddress(rep.0 + 8), 248)],
                        )
                        .unwrap();
                    in_flight.insert(head, (slot, unique));
                    next += 1;
                }
                queue.publish().unwrap();
                while let Some((head, len)) = queue.poll_used().unwrap() {
                    let (slot, unique) = in_flight.remove(&head).expect("known head");
                    let mut bytes = vec![0u8; len as usize];
                    mem.read_slice(&mut bytes, buffers[slot].1).unwrap();
                    let reply = wire::Reply::parse(9999, &bytes).expect("framed reply");
                    assert_eq!(reply.unique, unique, "reply landed in the wrong chain");
                    let n = 1 + ((unique & 0xffff_ffff) % 7) as usize;
                    assert_eq!(reply.payload, unique.to_le_bytes().repeat(n));
                    free.push(slot);
                    done += 1;
                }
                assert!(std::time::Instant::now() < deadline, "requests stalled");
                std::thread::yield_now();
            }
            done
        }));
    }
    for thread in threads {
        assert_eq!(thread.join().expect("driver thread"), REQUESTS_PER_QUEUE);
    }
    for queue in 1..=QUEUES {
        assert_eq!(
            handler.per_queue[queue].load(Ordering::SeqCst) as u64,
            REQUESTS_PER_QUEUE,
            "queue {queue}"
        );
    }
    assert_eq!(handler.per_queue[0].load(Ordering::SeqCst), 0);
    drop(driver);
    server
        .join()
        .expect("server thread")
        .expect("clean shutdown");
}
