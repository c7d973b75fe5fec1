//! A standalone loopback S3 server (s3s-fs over a directory) for trying
//! `sluice objbench --storage s3` and `sluice format --storage s3` by hand:
//!
//! ```text
//! cargo run --release -p sluice-engine --features s3-test-server --example s3_server -- DIR [PORT]
//! ```
//!
//! It accepts the key pair in `S3_ACCESS_KEY` / `S3_SECRET_KEY` (default
//! `sluice` / `sluice-secret`), listens on 127.0.0.1 only, and runs until
//! killed. `S3_DELAY_MS=N` holds every answer N ms first, a stand-in for a
//! remote store's time to first byte (benches/vs-juicefs-cache.sh).

use std::net::SocketAddr;

use sluice_engine::object::s3_test_server::TestS3Server;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next() else {
        eprintln!("usage: s3_server DIR [PORT]");
        std::process::exit(2);
    };
    let port: u16 = args.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let ak = std::env::var("S3_ACCESS_KEY").unwrap_or_else(|_| "sluice".into());
    let sk = std::env::var("S3_SECRET_KEY").unwrap_or_else(|_| "sluice-secret".into());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let server = TestS3Server::start_on(
        std::path::Path::new(&dir),
        SocketAddr::from(([127, 0, 0, 1], port)),
        &ak,
        &sk,
        threads,
    )?;
    if let Ok(ms) = std::env::var("S3_DELAY_MS") {
        let Ok(ms) = ms.parse::<u64>() else {
            eprintln!("S3_DELAY_MS takes a number of milliseconds, not {ms:?}");
            std::process::exit(2);
        };
        server
            .faults()
            .set(0, 1000, std::time::Duration::from_millis(ms), 0, 0);
    }
    println!("http://{}", server.addr());
    loop {
        std::thread::park();
    }
}
