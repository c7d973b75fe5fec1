//! Golden placement plans: the printed plan for fixed VM sets on every sysfs fixture must match
//! `tests/golden/<fixture>.txt`. After an intended policy change, rerun with
//! `SLUICE_BLESS=1 cargo test -p sluice-numa --test placement_golden` and review the diff.

use std::path::PathBuf;

use sluice_numa::{NodeId, PageLocations, PlacementOptions, Topology, VmRequest, describe, plan};

fn vm(name: &str, queues: usize, memory: &[(NodeId, u64)]) -> VmRequest {
    VmRequest {
        name: name.into(),
        queues,
        memory: PageLocations::from_counts(memory.iter().copied()),
    }
}

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn check(fixture: &str, vms: &[VmRequest]) {
    let topology = Topology::from_sysfs(&manifest().join("tests/fixtures").join(fixture)).unwrap();
    let text = describe(&topology, vms, PlacementOptions::default()).unwrap();
    // Invariants every plan keeps, whatever the golden text says.
    let p = plan(&topology, vms, PlacementOptions::default()).unwrap();
    let mut cpus: Vec<usize> = p.workers.iter().map(|w| w.cpu).collect();
    cpus.dedup();
    assert_eq!(
        cpus.len(),
        p.workers.len(),
        "a core runs two workers:\n{text}"
    );
    for (i, v) in vms.iter().enumerate() {
        for q in 0..v.queues {
            let w = p.worker_for(i, q).expect("every queue has a worker");
            assert_eq!(w.node, p.vms[i].worker_node);
        }
    }
    let golden = manifest()
        .join("tests/golden")
        .join(format!("{fixture}.txt"));
    if std::env::var_os("SLUICE_BLESS").is_some() {
        std::fs::write(&golden, &text).unwrap();
    }
    let want = std::fs::read_to_string(&golden)
        .unwrap_or_else(|e| panic!("{}: {e}; run with SLUICE_BLESS=1", golden.display()));
    assert_eq!(
        text,
        want,
        "plan for {fixture} differs from {}",
        golden.display()
    );
}

#[test]
fn kunpeng920_two_sockets() {
    check(
        "kunpeng920-2s",
        &[
            vm("train-a", 16, &[(0, 4096)]),
            vm("train-b", 48, &[(2, 4096)]),
            vm("spread", 8, &[(1, 600), (3, 400)]),
            vm("small", 1, &[(3, 10)]),
        ],
    );
}

#[test]
fn graviton3() {
    check(
        "graviton3",
        &[vm("a", 64, &[(0, 1)]), vm("b", 4, &[(0, 1)])],
    );
}

#[test]
fn grace() {
    check(
        "grace",
        &[
            vm("a", 8, &[(0, 1)]),
            vm("b", 8, &[(0, 1)]),
            vm("cold", 2, &[]),
        ],
    );
}

#[test]
fn grace_hopper_memory_only_node() {
    check(
        "gh200",
        &[vm("hbm", 4, &[(1, 100)]), vm("ddr", 4, &[(0, 100)])],
    );
}

#[test]
fn x86_two_sockets_with_smt() {
    check(
        "x86-2s-smt",
        &[vm("a", 16, &[(0, 100)]), vm("b", 8, &[(1, 90), (0, 10)])],
    );
}

#[test]
fn single_node_host() {
    check(
        "host-1node",
        &[vm("a", 2, &[(0, 1)]), vm("b", 1, &[(0, 1)])],
    );
}

#[test]
fn this_host_places_a_vm_on_its_own_memory() {
    // A real mapping stands in for guest memory: ask the kernel where it lives.
    let buf = sluice_numa::NodeBuffer::new(1 << 20, None, sluice_numa::PageSize::Normal).unwrap();
    // qemu-user has no move_pages; placement then falls back to the first node.
    let memory = buf.locate().unwrap_or_default();
    let topology = Topology::host().unwrap();
    let vms = [VmRequest {
        name: "local".into(),
        queues: 4,
        memory,
    }];
    let p = plan(&topology, &vms, PlacementOptions::default()).unwrap();
    let node = p.vms[0].worker_node;
    assert!(!topology.node(node).unwrap().cpus.is_empty());
    assert!(p.workers.iter().all(|w| w.node == node));
    assert!(!p.describe().is_empty());
}
