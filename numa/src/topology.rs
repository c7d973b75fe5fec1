//! The machine's NUMA layout read from sysfs: nodes, their CPUs and memory, the distance
//! matrix, sockets and SMT siblings.
//!
//! The sysfs root is a parameter so tests read trimmed copies of real machines
//! (`numa/tests/fixtures/*`) instead of the host's `/sys`.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::cpuset::{CpuListError, CpuSet};

/// A NUMA node number as the kernel numbers it.
pub type NodeId = usize;

/// Why the topology could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// A sysfs file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A sysfs file held a CPU list the kernel would never print.
    #[error("bad CPU list in {path}: {source}")]
    CpuList {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        #[source]
        source: CpuListError,
    },
    /// A sysfs file held something other than the number or table it should.
    #[error("unexpected contents in {path}: {what}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What was expected.
        what: String,
    },
    /// No online CPU was found at all.
    #[error("sysfs under {root} lists no online CPU")]
    NoCpus {
        /// The sysfs root that was read.
        root: PathBuf,
    },
}

/// One NUMA node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// The kernel's node number.
    pub id: NodeId,
    /// Online CPUs on this node (empty for memory-only nodes such as CXL or GPU HBM).
    pub cpus: CpuSet,
    /// Memory on this node in bytes (0 when the node has none or sysfs does not say).
    pub mem_bytes: u64,
}

/// One logical CPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cpu {
    /// The kernel's CPU number.
    pub id: usize,
    /// The node the CPU belongs to.
    pub node: NodeId,
    /// The socket (`physical_package_id`).
    pub package: u32,
    /// The physical core id within the package (`core_id`).
    pub core: u32,
    /// All hardware threads of this CPU's physical core, itself included.
    pub siblings: CpuSet,
}

/// The NUMA layout of one machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    nodes: Vec<Node>,
    cpus: Vec<Cpu>,
    /// `distances[i][j]`: distance from `nodes[i]` to `nodes[j]` (10 = local).
    distances: Vec<Vec<u32>>,
}

/// Distance the kernel reports between a node and itself.
pub const LOCAL_DISTANCE: u32 = 10;

impl Topology {
    /// Reads the host's topology from `/sys`.
    pub fn host() -> Result<Self, TopologyError> {
        Self::from_sysfs(Path::new("/sys"))
    }

    /// Reads the topology from a sysfs tree mounted (or copied) at `root`.
    ///
    /// A kernel built without NUMA has no `devices/system/node`; then every online CPU is put on
    /// one node 0.
    pub fn from_sysfs(root: &Path) -> Result<Self, TopologyError> {
        let cpu_dir = root.join("devices/system/cpu");
        let online = read_cpuset(&cpu_dir.join("online"))?;
        if online.is_empty() {
            return Err(TopologyError::NoCpus {
                root: root.to_path_buf(),
            });
        }
        let node_dir = root.join("devices/system/node");
        let mut nodes = Vec::new();
        let mut distances = Vec::new();
        if node_dir.is_dir() {
            let ids = match read_optional(&node_dir.join("online"))? {
                Some(text) => CpuSet::parse(&text)
                    .map_err(|source| TopologyError::CpuList {
                        path: node_dir.join("online"),
                        source,
                    })?
                    .as_slice()
                    .to_vec(),
                None => list_node_dirs(&node_dir)?,
            };
            for id in &ids {
                let dir = node_dir.join(format!("node{id}"));
                let cpus = read_cpuset(&dir.join("cpulist"))?;
                let cpus = CpuSet::from_cpus(cpus.iter().filter(|c| online.contains(*c)));
                let mem_bytes = match read_optional(&dir.join("meminfo"))? {
                    Some(text) => parse_mem_total(&text, &dir.join("meminfo"))?,
                    None => 0,
                };
                nodes.push(Node {
                    id: *id,
                    cpus,
                    mem_bytes,
                });
                distances.push(read_distances(&dir.join("distance"), ids.len())?);
            }
        }
        if nodes.is_empty() {
            nodes.push(Node {
                id: 0,
                cpus: online.clone(),
                mem_bytes: 0,
            });
            distances.push(vec![LOCAL_DISTANCE]);
        }
        let mut cpus = Vec::with_capacity(online.len());
        for id in online.iter() {
            let node = nodes
                .iter()
                .find(|n| n.cpus.contains(id))
                .map_or(nodes[0].id, |n| n.id);
            let dir = cpu_dir.join(format!("cpu{id}/topology"));
            let package = read_optional_u32(&dir.join("physical_package_id"))?.unwrap_or(0);
            let core = read_optional_u32(&dir.join("core_id"))?.unwrap_or(id as u32);
            let siblings = match read_optional(&dir.join("thread_siblings_list"))? {
                Some(text) => CpuSet::parse(&text).map_err(|source| TopologyError::CpuList {
                    path: dir.join("thread_siblings_list"),
                    source,
                })?,
                None => CpuSet::from_cpus([id]),
            };
            let siblings = CpuSet::from_cpus(siblings.iter().filter(|c| online.contains(*c)));
            cpus.push(Cpu {
                id,
                node,
                package,
                core,
                siblings,
            });
        }
        // A CPU that no node lists (an odd sysfs) lands on the first node.
        for cpu in &cpus {
            if !nodes.iter().any(|n| n.cpus.contains(cpu.id)) {
                nodes[0].cpus.insert(cpu.id);
            }
        }
        Ok(Self {
            nodes,
            cpus,
            distances,
        })
    }

    /// The nodes in ascending id order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The online CPUs in ascending id order.
    pub fn cpus(&self) -> &[Cpu] {
        &self.cpus
    }

    /// The node with id `id`.
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// The CPU with id `id`.
    pub fn cpu(&self, id: usize) -> Option<&Cpu> {
        self.cpus.iter().find(|c| c.id == id)
    }

    /// The kernel's distance from node `from` to node `to` (10 = local), if both exist.
    pub fn distance(&self, from: NodeId, to: NodeId) -> Option<u32> {
        let i = self.nodes.iter().position(|n| n.id == from)?;
        let j = self.nodes.iter().position(|n| n.id == to)?;
        self.distances.get(i)?.get(j).copied()
    }

    /// The sockets (physical packages) present, ascending.
    pub fn packages(&self) -> Vec<u32> {
        let mut p: Vec<u32> = self.cpus.iter().map(|c| c.package).collect();
        p.sort_unstable();
        p.dedup();
        p
    }

    /// Whether any physical core runs more than one hardware thread.
    pub fn has_smt(&self) -> bool {
        self.cpus.iter().any(|c| c.siblings.len() > 1)
    }

    /// Nodes with CPUs ordered by distance from `from` (itself first when it has CPUs); ties go
    /// to the lower node id.
    pub fn nearest_cpu_nodes(&self, from: NodeId) -> Vec<NodeId> {
        let mut candidates: Vec<(u32, NodeId)> = self
            .nodes
            .iter()
            .filter(|n| !n.cpus.is_empty())
            .map(|n| (self.distance(from, n.id).unwrap_or(u32::MAX), n.id))
            .collect();
        candidates.sort_unstable();
        candidates.into_iter().map(|(_, id)| id).collect()
    }
}

/// Prints a summary like `numactl --hardware`.
impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let threads = self
            .cpus
            .iter()
            .map(|c| c.siblings.len())
            .max()
            .unwrap_or(1);
        writeln!(
            f,
            "topology: {} node(s), {} socket(s), {} CPU(s), {} thread(s) per core",
            self.nodes.len(),
            self.packages().len(),
            self.cpus.len(),
            threads
        )?;
        for node in &self.nodes {
            writeln!(
                f,
                "  node {}: cpus {} ({}), memory {} MiB",
                node.id,
                node.cpus,
                node.cpus.len(),
                node.mem_bytes >> 20
            )?;
        }
        write!(f, "  distances:")?;
        for node in &self.nodes {
            write!(f, " {:>4}", node.id)?;
        }
        writeln!(f)?;
        for (i, node) in self.nodes.iter().enumerate() {
            write!(f, "  {:>10}", node.id)?;
            for d in &self.distances[i] {
                write!(f, " {d:>4}")?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

fn read(path: &Path) -> Result<String, TopologyError> {
    fs::read_to_string(path).map_err(|source| TopologyError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn read_optional(path: &Path) -> Result<Option<String>, TopologyError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TopologyError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn read_optional_u32(path: &Path) -> Result<Option<u32>, TopologyError> {
    let Some(text) = read_optional(path)? else {
        return Ok(None);
    };
    // physical_package_id is -1 on some virtual machines; treat it as socket 0.
    match text.trim().parse::<i64>() {
        Ok(v) => Ok(Some(u32::try_from(v).unwrap_or(0))),
        Err(_) => Err(TopologyError::Malformed {
            path: path.to_path_buf(),
            what: "expected a number".into(),
        }),
    }
}

fn read_cpuset(path: &Path) -> Result<CpuSet, TopologyError> {
    CpuSet::parse(&read(path)?).map_err(|source| TopologyError::CpuList {
        path: path.to_path_buf(),
        source,
    })
}

fn list_node_dirs(dir: &Path) -> Result<Vec<NodeId>, TopologyError> {
    let entries = fs::read_dir(dir).map_err(|source| TopologyError::Read {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut ids: Vec<NodeId> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

/// Parses `Node 0 MemTotal:  131072000 kB` out of a node's meminfo.
fn parse_mem_total(text: &str, path: &Path) -> Result<u64, TopologyError> {
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.nth(2) == Some("MemTotal:") {
            let kib: u64 = words.next().and_then(|w| w.parse().ok()).ok_or_else(|| {
                TopologyError::Malformed {
                    path: path.to_path_buf(),
                    what: "MemTotal is not a number of kB".into(),
                }
            })?;
            return Ok(kib.saturating_mul(1024));
        }
    }
    Err(TopologyError::Malformed {
        path: path.to_path_buf(),
        what: "no MemTotal line".into(),
    })
}

fn read_distances(path: &Path, nodes: usize) -> Result<Vec<u32>, TopologyError> {
    let text = read(path)?;
    let row: Result<Vec<u32>, _> = text.split_whitespace().map(str::parse).collect();
    match row {
        Ok(row) if row.len() == nodes => Ok(row),
        _ => Err(TopologyError::Malformed {
            path: path.to_path_buf(),
            what: format!("expected {nodes} distances"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Topology {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        Topology::from_sysfs(&root).unwrap()
    }

    #[test]
    fn reads_kunpeng_920_two_sockets_four_nodes() {
        let t = fixture("kunpeng920-2s");
        assert_eq!(t.nodes().len(), 4);
        assert_eq!(t.cpus().len(), 128);
        assert_eq!(t.packages(), vec![0, 1]);
        assert!(!t.has_smt());
        assert_eq!(t.node(2).unwrap().cpus.to_string(), "64-95");
        assert_eq!(t.distance(0, 1), Some(12));
        assert_eq!(t.distance(1, 3), Some(24));
        assert_eq!(t.cpu(70).unwrap().node, 2);
        assert_eq!(t.cpu(70).unwrap().package, 1);
        assert_eq!(t.nearest_cpu_nodes(1), vec![1, 0, 2, 3]);
        assert_eq!(t.nearest_cpu_nodes(3), vec![3, 2, 0, 1]);
    }

    #[test]
    fn reads_single_node_arm_servers() {
        let g = fixture("graviton3");
        assert_eq!((g.nodes().len(), g.cpus().len()), (1, 64));
        let grace = fixture("grace");
        assert_eq!((grace.nodes().len(), grace.cpus().len()), (1, 72));
        assert_eq!(grace.distance(0, 0), Some(LOCAL_DISTANCE));
    }

    #[test]
    fn reads_x86_smt_siblings_and_sockets() {
        let t = fixture("x86-2s-smt");
        assert!(t.has_smt());
        assert_eq!(t.packages(), vec![0, 1]);
        assert_eq!(t.cpu(0).unwrap().siblings.to_string(), "0,32");
        assert_eq!(t.node(1).unwrap().cpus.to_string(), "16-31,48-63");
        assert_eq!(t.distance(0, 1), Some(21));
    }

    #[test]
    fn reads_memory_only_nodes() {
        let t = fixture("gh200");
        let hbm = t.node(1).unwrap();
        assert!(hbm.cpus.is_empty());
        assert!(hbm.mem_bytes > 0);
        assert_eq!(t.nearest_cpu_nodes(1), vec![0]);
    }

    #[test]
    fn reads_this_host() {
        let t = Topology::host().unwrap();
        assert!(!t.cpus().is_empty());
        let listed: usize = t.nodes().iter().map(|n| n.cpus.len()).sum();
        assert_eq!(listed, t.cpus().len());
        assert!(t.to_string().starts_with("topology: "));
    }

    #[test]
    fn falls_back_to_one_node_without_numa_in_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        let cpu = dir.path().join("devices/system/cpu");
        fs::create_dir_all(&cpu).unwrap();
        fs::write(cpu.join("online"), "0-3\n").unwrap();
        let t = Topology::from_sysfs(dir.path()).unwrap();
        assert_eq!(t.nodes().len(), 1);
        assert_eq!(t.node(0).unwrap().cpus.to_string(), "0-3");
    }

    #[test]
    fn reports_corrupt_files_with_their_path() {
        let dir = tempfile::tempdir().unwrap();
        let cpu = dir.path().join("devices/system/cpu");
        fs::create_dir_all(&cpu).unwrap();
        fs::write(cpu.join("online"), "zero\n").unwrap();
        let err = Topology::from_sysfs(dir.path()).unwrap_err();
        assert!(
            err.to_string().contains("devices/system/cpu/online"),
            "{err}"
        );
        let missing = Topology::from_sysfs(&dir.path().join("nope")).unwrap_err();
        assert!(matches!(missing, TopologyError::Read { .. }));
    }
}
