//! Where each VM's queue workers, the metadata and the background work run.
//!
//! The policy (see `numa/DESIGN.md` for the reasoning):
//!
//! * Each node with CPUs keeps its last `service_cores` physical cores for metadata, background
//!   work and the async (tokio) clients; the SMT siblings of data cores join that service set.
//!   A data worker therefore always has a whole physical core to itself.
//! * A VM's workers run on the node that holds most of its guest pages. If that node has no
//!   CPUs (CXL or GPU memory) they run on the nearest node that has, by the kernel's distances.
//! * The data cores of a node are shared out max-min fairly among the VMs that live there: every
//!   VM gets one core per queue if there are enough, otherwise cores are dealt one at a time in
//!   request order until they run out. A VM never gets more workers than queues.
//! * One core never runs two workers. With more queues than workers, a worker serves several
//!   queues (queue `q` goes to worker `q % workers`). A VM left without a core (more VMs than
//!   cores on a node) has its queues added to the node's least-loaded workers.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use crate::cpuset::CpuSet;
use crate::memory::PageLocations;
use crate::topology::{NodeId, Topology};

/// A request that the plan cannot satisfy.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlacementError {
    /// A VM asked for no queues at all.
    #[error("VM {vm:?} has no request queues; a virtio-fs device needs at least one")]
    NoQueues {
        /// The VM's name.
        vm: String,
    },
    /// The guest's pages are said to live on a node the topology does not have.
    #[error("VM {vm:?} has memory on node {node}, which this machine does not have")]
    UnknownNode {
        /// The VM's name.
        vm: String,
        /// The node.
        node: NodeId,
    },
}

/// Knobs of the placement policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlacementOptions {
    /// Physical cores per node kept for metadata, background work and async clients.
    pub service_cores: usize,
}

impl Default for PlacementOptions {
    fn default() -> Self {
        Self { service_cores: 1 }
    }
}

/// One VM to place: its name, queue count and where its guest memory lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmRequest {
    /// The VM's name (for the printed plan).
    pub name: String,
    /// Number of virtio-fs request queues.
    pub queues: usize,
    /// Where the guest's pages live (from [`crate::memory::locate_pages`]).
    pub memory: PageLocations,
}

/// The CPUs of one node, split into data and service roles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePlan {
    /// The node.
    pub node: NodeId,
    /// CPUs that may run data workers (one per physical core), in the order they are handed out.
    pub data_cpus: Vec<usize>,
    /// CPUs for metadata, background work and async clients.
    pub service_cpus: CpuSet,
    /// Whether the node had too few cores to keep service work off the data cores.
    pub service_shares_data: bool,
}

/// A queue of a VM: indexes into [`Plan::vms`] and the VM's queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct QueueRef {
    /// Index of the VM in the request list.
    pub vm: usize,
    /// Queue number within the VM.
    pub queue: usize,
}

/// One data worker thread: its core and the queues it serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerPlan {
    /// The CPU the worker is pinned to.
    pub cpu: usize,
    /// The node of that CPU.
    pub node: NodeId,
    /// The queues it serves, in order.
    pub queues: Vec<QueueRef>,
}

/// Where one VM ended up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmPlan {
    /// The VM's name.
    pub name: String,
    /// Number of queues.
    pub queues: usize,
    /// The node holding most of the guest's pages, if any page was found.
    pub memory_node: Option<NodeId>,
    /// The node whose cores run the VM's workers.
    pub worker_node: NodeId,
    /// Guest pages per node, as located.
    pub memory: BTreeMap<NodeId, u64>,
    /// CPUs of workers started for this VM (empty when it shares other VMs' workers).
    pub own_cpus: Vec<usize>,
}

/// The whole placement: nodes, workers, VMs and any notes for the operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// One entry per node with CPUs.
    pub nodes: Vec<NodePlan>,
    /// One entry per data worker, ascending CPU.
    pub workers: Vec<WorkerPlan>,
    /// One entry per requested VM, in request order.
    pub vms: Vec<VmPlan>,
    /// Warnings worth printing (memory spread over nodes, shared workers, ...).
    pub notes: Vec<String>,
    options: PlacementOptions,
}

impl Plan {
    /// The worker serving queue `queue` of VM `vm`, if the plan has one.
    pub fn worker_for(&self, vm: usize, queue: usize) -> Option<&WorkerPlan> {
        let q = QueueRef { vm, queue };
        self.workers.iter().find(|w| w.queues.contains(&q))
    }

    /// The service CPUs of node `node` (where metadata and background threads are pinned).
    pub fn service_cpus(&self, node: NodeId) -> Option<&CpuSet> {
        self.nodes
            .iter()
            .find(|n| n.node == node)
            .map(|n| &n.service_cpus)
    }

    /// The plan as text for the operator (`sluice serve` prints it).
    pub fn describe(&self) -> String {
        self.to_string()
    }
}

/// Computes a placement for `vms` on `topology`.
pub fn plan(
    topology: &Topology,
    vms: &[VmRequest],
    options: PlacementOptions,
) -> Result<Plan, PlacementError> {
    let nodes: Vec<NodePlan> = topology
        .nodes()
        .iter()
        .filter(|n| !n.cpus.is_empty())
        .map(|n| split_node(topology, n.id, &n.cpus, options.service_cores))
        .collect();
    let mut notes = Vec::new();
    let mut vm_plans = Vec::with_capacity(vms.len());
    for vm in vms {
        if vm.queues == 0 {
            return Err(PlacementError::NoQueues {
                vm: vm.name.clone(),
            });
        }
        if let Some(node) = vm
            .memory
            .per_node
            .keys()
            .find(|n| topology.node(**n).is_none())
        {
            return Err(PlacementError::UnknownNode {
                vm: vm.name.clone(),
                node: *node,
            });
        }
        let memory_node = vm.memory.majority_node();
        let worker_node = match memory_node {
            Some(home) => topology.nearest_cpu_nodes(home)[0],
            None => {
                notes.push(format!(
                    "vm {:?}: no guest page is resident yet, so its memory node is unknown; \
                     workers go to node {}",
                    vm.name, nodes[0].node
                ));
                nodes[0].node
            }
        };
        if let Some(home) = memory_node {
            if home != worker_node {
                notes.push(format!(
                    "vm {:?}: memory node {home} has no CPUs; workers run on the nearest node \
                     {worker_node} (distance {})",
                    vm.name,
                    topology.distance(home, worker_node).unwrap_or(0)
                ));
            }
            let total: u64 = vm.memory.per_node.values().sum();
            let home_pages = vm.memory.per_node.get(&home).copied().unwrap_or(0);
            if home_pages < total {
                notes.push(format!(
                    "vm {:?}: guest memory is spread over nodes ({}); {}% of its pages are \
                     remote to its workers; bind the guest's memory to one node \
                     (memory-backend policy=bind) to avoid it",
                    vm.name,
                    share_text(&vm.memory.per_node),
                    ((total - home_pages) * 100).div_ceil(total)
                ));
            }
        }
        vm_plans.push(VmPlan {
            name: vm.name.clone(),
            queues: vm.queues,
            memory_node,
            worker_node,
            memory: vm.memory.per_node.clone(),
            own_cpus: Vec::new(),
        });
    }

    let mut workers: Vec<WorkerPlan> = Vec::new();
    for node in &nodes {
        let members: Vec<usize> = (0..vm_plans.len())
            .filter(|i| vm_plans[*i].worker_node == node.node)
            .collect();
        if members.is_empty() {
            continue;
        }
        // Max-min fair share: deal one core per round to each VM still short of cores.
        let mut counts = vec![0usize; members.len()];
        let mut left = node.data_cpus.len();
        while left > 0 {
            let mut dealt = false;
            for (slot, vm) in members.iter().enumerate() {
                if left > 0 && counts[slot] < vm_plans[*vm].queues {
                    counts[slot] += 1;
                    left -= 1;
                    dealt = true;
                }
            }
            if !dealt {
                break;
            }
        }
        let mut next = 0;
        let first_worker = workers.len();
        for (slot, vm) in members.iter().enumerate() {
            let cpus = &node.data_cpus[next..next + counts[slot]];
            next += counts[slot];
            let base = workers.len();
            for cpu in cpus {
                workers.push(WorkerPlan {
                    cpu: *cpu,
                    node: node.node,
                    queues: Vec::new(),
                });
            }
            vm_plans[*vm].own_cpus = cpus.to_vec();
            let n = cpus.len();
            if n > 0 {
                for queue in 0..vm_plans[*vm].queues {
                    workers[base + queue % n]
                        .queues
                        .push(QueueRef { vm: *vm, queue });
                }
                if vm_plans[*vm].queues > n {
                    notes.push(format!(
                        "vm {:?}: {} queues on {} core(s); each worker serves up to {} queues",
                        vm_plans[*vm].name,
                        vm_plans[*vm].queues,
                        n,
                        vm_plans[*vm].queues.div_ceil(n)
                    ));
                }
            }
        }
        // VMs that got no core of their own join the least-loaded workers of the node.
        for (slot, vm) in members.iter().enumerate() {
            if counts[slot] > 0 {
                continue;
            }
            notes.push(format!(
                "vm {:?}: node {} has no free data core; its queues share other VMs' workers",
                vm_plans[*vm].name, node.node
            ));
            for queue in 0..vm_plans[*vm].queues {
                let target = (first_worker..workers.len())
                    .min_by_key(|w| (workers[*w].queues.len(), workers[*w].cpu))
                    .unwrap_or(first_worker);
                workers[target].queues.push(QueueRef { vm: *vm, queue });
            }
        }
    }
    workers.sort_by_key(|w| w.cpu);
    for node in &nodes {
        if node.service_shares_data {
            notes.push(format!(
                "node {}: too few cores to keep service work off the data cores; cpu {} does both",
                node.node, node.service_cpus
            ));
        }
    }
    Ok(Plan {
        nodes,
        workers,
        vms: vm_plans,
        notes,
        options,
    })
}

/// Splits a node's CPUs into data CPUs (first thread of each physical core) and service CPUs
/// (the last `service_cores` physical cores plus the other threads of data cores).
fn split_node(topology: &Topology, node: NodeId, cpus: &CpuSet, service_cores: usize) -> NodePlan {
    // Physical cores, each as its threads on this node, ordered by their lowest CPU.
    let mut cores: Vec<Vec<usize>> = Vec::new();
    for cpu in cpus.iter() {
        if cores.iter().any(|c| c.contains(&cpu)) {
            continue;
        }
        let threads = topology
            .cpu(cpu)
            .map(|c| c.siblings.iter().filter(|s| cpus.contains(*s)).collect())
            .unwrap_or_else(|| vec![cpu]);
        cores.push(threads);
    }
    let service_count = service_cores.min(cores.len().saturating_sub(1));
    let shares = service_cores > 0 && service_count < service_cores;
    let (data, service) = cores.split_at(cores.len() - service_count);
    let mut service_cpus: CpuSet = CpuSet::from_cpus(service.iter().flatten().copied());
    for core in data {
        for extra in &core[1..] {
            service_cpus.insert(*extra);
        }
    }
    if shares {
        // Too small a node: the last data core also runs service work.
        if let Some(core) = data.last() {
            service_cpus.insert(core[0]);
        }
    }
    NodePlan {
        node,
        data_cpus: data.iter().map(|c| c[0]).collect(),
        service_cpus,
        service_shares_data: shares,
    }
}

fn share_text(per_node: &BTreeMap<NodeId, u64>) -> String {
    let total: u64 = per_node.values().sum::<u64>().max(1);
    per_node
        .iter()
        .map(|(node, pages)| format!("node {node} {}%", pages * 100 / total))
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "placement: {} VM(s), {} data worker(s), {} service core(s) per node",
            self.vms.len(),
            self.workers.len(),
            self.options.service_cores
        )?;
        for node in &self.nodes {
            writeln!(
                f,
                "node {}: data cpus {} ({}), service cpus {}",
                node.node,
                CpuSet::from_cpus(node.data_cpus.iter().copied()),
                node.data_cpus.len(),
                node.service_cpus
            )?;
        }
        for vm in &self.vms {
            let memory = match vm.memory_node {
                Some(_) => share_text(&vm.memory),
                None => "not resident".to_string(),
            };
            writeln!(
                f,
                "vm {:?}: {} queue(s), memory {}, workers on node {}: cpus {}",
                vm.name,
                vm.queues,
                memory,
                vm.worker_node,
                CpuSet::from_cpus(vm.own_cpus.iter().copied())
            )?;
        }
        for worker in &self.workers {
            let mut line = String::new();
            for q in &worker.queues {
                let _ = write!(line, " {}:q{}", self.vms[q.vm].name, q.queue);
            }
            writeln!(
                f,
                "  worker cpu {} (node {}):{line}",
                worker.cpu, worker.node
            )?;
        }
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn fixture(name: &str) -> Topology {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        Topology::from_sysfs(&root).unwrap()
    }

    fn vm(name: &str, queues: usize, memory: &[(NodeId, u64)]) -> VmRequest {
        VmRequest {
            name: name.into(),
            queues,
            memory: PageLocations::from_counts(memory.iter().copied()),
        }
    }

    fn assert_no_core_runs_two_workers(plan: &Plan) {
        let mut cpus: Vec<usize> = plan.workers.iter().map(|w| w.cpu).collect();
        cpus.sort_unstable();
        cpus.dedup();
        assert_eq!(cpus.len(), plan.workers.len(), "{plan}");
        for w in &plan.workers {
            for n in &plan.nodes {
                assert!(
                    !n.service_cpus.contains(w.cpu) || n.service_shares_data,
                    "worker on service cpu {}",
                    w.cpu
                );
            }
        }
    }

    #[test]
    fn workers_follow_guest_memory_and_every_queue_has_one_worker() {
        let t = fixture("kunpeng920-2s");
        let vms = [vm("a", 8, &[(2, 100)]), vm("b", 4, &[(1, 10)])];
        let p = plan(&t, &vms, PlacementOptions::default()).unwrap();
        assert_eq!(p.vms[0].worker_node, 2);
        assert_eq!(p.vms[0].own_cpus, (64..72).collect::<Vec<_>>());
        assert_eq!(p.vms[1].own_cpus, (32..36).collect::<Vec<_>>());
        assert_eq!(p.service_cpus(2).unwrap().to_string(), "95");
        for (i, v) in vms.iter().enumerate() {
            for q in 0..v.queues {
                assert_eq!(p.worker_for(i, q).unwrap().node, p.vms[i].worker_node);
            }
        }
        assert_no_core_runs_two_workers(&p);
    }

    #[test]
    fn more_queues_than_cores_share_workers_not_cores() {
        let t = fixture("host-1node");
        let p = plan(&t, &[vm("a", 4, &[(0, 1)])], PlacementOptions::default()).unwrap();
        assert_eq!(p.workers.len(), 1);
        assert_eq!(p.workers[0].cpu, 0);
        assert_eq!(p.workers[0].queues.len(), 4);
        assert_eq!(p.service_cpus(0).unwrap().to_string(), "1");
        assert_no_core_runs_two_workers(&p);
    }

    #[test]
    fn cores_are_shared_fairly_and_late_vms_join_least_loaded_workers() {
        let t = fixture("host-1node");
        let vms = [vm("a", 2, &[(0, 1)]), vm("b", 2, &[(0, 1)])];
        let p = plan(&t, &vms, PlacementOptions::default()).unwrap();
        assert_eq!(p.workers.len(), 1);
        assert_eq!(p.workers[0].queues.len(), 4);
        assert!(p.notes.iter().any(|n| n.contains("no free data core")));

        let t = fixture("graviton3");
        let vms = [vm("big", 100, &[(0, 1)]), vm("small", 2, &[(0, 1)])];
        let p = plan(&t, &vms, PlacementOptions::default()).unwrap();
        assert_eq!(p.vms[1].own_cpus.len(), 2);
        assert_eq!(p.vms[0].own_cpus.len(), 61);
        assert_no_core_runs_two_workers(&p);
    }

    #[test]
    fn memory_only_node_sends_workers_to_nearest_cpu_node() {
        let t = fixture("gh200");
        let p = plan(&t, &[vm("g", 4, &[(1, 50)])], PlacementOptions::default()).unwrap();
        assert_eq!(p.vms[0].memory_node, Some(1));
        assert_eq!(p.vms[0].worker_node, 0);
        assert!(p.notes.iter().any(|n| n.contains("has no CPUs")));
    }

    #[test]
    fn spread_memory_goes_to_majority_node_with_a_note() {
        let t = fixture("kunpeng920-2s");
        let p = plan(
            &t,
            &[vm("s", 2, &[(1, 60), (3, 40)])],
            PlacementOptions::default(),
        )
        .unwrap();
        assert_eq!(p.vms[0].worker_node, 1);
        assert!(
            p.notes
                .iter()
                .any(|n| n.contains("40% of its pages are remote"))
        );
    }

    #[test]
    fn smt_siblings_of_data_cores_are_service_cpus() {
        let t = fixture("x86-2s-smt");
        let p = plan(&t, &[vm("a", 64, &[(0, 1)])], PlacementOptions::default()).unwrap();
        assert_eq!(p.nodes[0].data_cpus, (0..15).collect::<Vec<_>>());
        assert_eq!(p.nodes[0].service_cpus.to_string(), "15,32-47");
        assert_eq!(p.workers.len(), 15);
        assert_no_core_runs_two_workers(&p);
    }

    #[test]
    fn rejects_bad_requests() {
        let t = fixture("grace");
        assert_eq!(
            plan(&t, &[vm("z", 0, &[(0, 1)])], PlacementOptions::default()),
            Err(PlacementError::NoQueues { vm: "z".into() })
        );
        assert!(matches!(
            plan(&t, &[vm("z", 1, &[(7, 1)])], PlacementOptions::default()),
            Err(PlacementError::UnknownNode { node: 7, .. })
        ));
    }
}
