//! The fuzz harnesses in the ordinary test run: every input of the seed
//! corpus (`fuzz/corpus/<target>/`), then generated inputs from fixed
//! seeds. `fuzz/run.sh` runs the same harnesses under libFuzzer.

use std::path::Path;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files.iter().map(|f| std::fs::read(f).unwrap()).collect()
}

fn generated(seed: u64, count: usize, max_len: usize) -> impl Iterator<Item = Vec<u8>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..count).map(move |_| {
        let len = rng.random_range(0..max_len);
        (0..len).map(|_| rng.random()).collect()
    })
}

#[test]
fn request_sequences_keep_the_export_whole() {
    let seeds = corpus("requests");
    assert!(!seeds.is_empty(), "the seed corpus is in the repository");
    for input in seeds.iter().cloned().chain(generated(19, 300, 1500)) {
        sluice_fuzz::requests::run(&input);
    }
    eprintln!("{} requests", sluice_fuzz::requests::requests_sent());
}

#[test]
fn descriptor_chains_never_stop_the_device() {
    let seeds = corpus("chains");
    assert!(!seeds.is_empty(), "the seed corpus is in the repository");
    for input in seeds.iter().cloned().chain(generated(21, 200, 600)) {
        sluice_fuzz::chains::run(&input);
    }
    let checked = sluice_fuzz::chains::split_writes_checked();
    eprintln!("{checked} split WRITEs read back");
    assert!(checked > 0, "no honest split WRITE was read back");
}

#[test]
fn host_protocol_clients_never_disturb_the_others() {
    let seeds = corpus("host");
    assert!(!seeds.is_empty(), "the seed corpus is in the repository");
    for input in seeds.iter().cloned().chain(generated(23, 200, 400)) {
        sluice_fuzz::host::run(&input);
    }
    eprintln!("{} blocks fetched", sluice_fuzz::host::fetches());
}
