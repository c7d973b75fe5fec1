//! Node-local memory (mmap + mbind, optional huge pages) and asking the kernel which node holds
//! the pages of a mapping (`move_pages`).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::ptr::NonNull;

use crate::topology::NodeId;

/// `MADV_POPULATE_WRITE` (Linux 5.14, asm-generic value shared by x86_64 and aarch64): faults
/// the range in and reports failure as an error instead of a SIGBUS.
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// The base page size assumed when sysconf cannot say.
const FALLBACK_PAGE_SIZE: usize = 4096;

/// Why node-local memory could not be set up or located.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// A zero-length buffer was asked for.
    #[error("a node-local buffer must not be empty")]
    Empty,
    /// mmap failed.
    #[error("cannot map {len} bytes: {source}")]
    Map {
        /// Requested length.
        len: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// mbind refused the node.
    #[error("cannot bind memory to node {node}: {source}")]
    Bind {
        /// The node.
        node: NodeId,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Faulting the pages in failed (the node is out of memory or huge pages).
    #[error("cannot allocate {len} bytes on node {node:?}: {source}")]
    Populate {
        /// Requested length.
        len: usize,
        /// The node, if one was asked for.
        node: Option<NodeId>,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Huge pages were required but none could be had.
    #[error(
        "no huge pages available for {len} bytes ({source}); reserve some with \
         `echo N > /proc/sys/vm/nr_hugepages` or allow normal pages"
    )]
    NoHugePages {
        /// Requested length.
        len: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `move_pages` failed.
    #[error("cannot ask the kernel where pages live (move_pages): {source}")]
    Locate {
        /// The OS error (ENOSYS under qemu-user or without CONFIG_NUMA).
        #[source]
        source: io::Error,
    },
}

/// Which page size a [`NodeBuffer`] uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageSize {
    /// Base pages (transparent huge pages may still back them; MADV_HUGEPAGE is set).
    Normal,
    /// hugetlbfs pages if the kernel has them reserved, otherwise base pages.
    HugeIfAvailable,
    /// hugetlbfs pages or an error.
    Huge,
}

/// How the kernel was told to place a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    /// No node was asked for: the default (first-touch) policy applies.
    Default,
    /// `mbind(MPOL_BIND)` to this node succeeded.
    Bound(NodeId),
    /// The kernel has no mbind (ENOSYS: built without NUMA, or qemu-user); placement unknown.
    Unsupported(NodeId),
}

/// Page-aligned anonymous memory placed on one NUMA node, faulted in up front.
///
/// Page alignment makes it usable for O_DIRECT and as an io_uring fixed buffer.
#[derive(Debug)]
pub struct NodeBuffer {
    ptr: NonNull<u8>,
    len: usize,
    map_len: usize,
    huge: bool,
    binding: Binding,
}

// SAFETY: NodeBuffer owns its mapping exclusively, like a Vec<u8>; shared access only hands out
// `&[u8]` and mutation needs `&mut self`.
unsafe impl Send for NodeBuffer {}
// SAFETY: as above; `&NodeBuffer` only permits reads.
unsafe impl Sync for NodeBuffer {}

/// The base page size of this machine.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|s| *s > 0)
        .unwrap_or(FALLBACK_PAGE_SIZE)
}

/// The default hugetlbfs page size from /proc/meminfo (2 MiB on x86_64 and 4K-granule aarch64).
pub fn huge_page_size() -> Option<usize> {
    let text = fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("Hugepagesize:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

impl NodeBuffer {
    /// Maps `len` bytes (rounded up to the page size), binds them to `node` (or leaves the
    /// default policy with `None`) and faults every page in so placement happens now.
    pub fn new(len: usize, node: Option<NodeId>, pages: PageSize) -> Result<Self, MemoryError> {
        if len == 0 {
            return Err(MemoryError::Empty);
        }
        if pages != PageSize::Normal {
            match Self::map(len, node, true) {
                Ok(buf) => return Ok(buf),
                Err(e) if pages == PageSize::Huge => {
                    return Err(match e {
                        MemoryError::Map { len, source }
                        | MemoryError::Populate { len, source, .. } => {
                            MemoryError::NoHugePages { len, source }
                        }
                        other => other,
                    });
                }
                Err(e) => log::debug!("huge pages unavailable ({e}); using base pages"),
            }
        }
        Self::map(len, node, false)
    }

    fn map(len: usize, node: Option<NodeId>, huge: bool) -> Result<Self, MemoryError> {
        let unit = if huge {
            huge_page_size().ok_or_else(|| MemoryError::Map {
                len,
                source: io::Error::from_raw_os_error(libc::ENOTSUP),
            })?
        } else {
            page_size()
        };
        let map_len = len
            .div_ceil(unit)
            .checked_mul(unit)
            .ok_or(MemoryError::Map {
                len,
                source: io::Error::from_raw_os_error(libc::EOVERFLOW),
            })?;
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        if huge {
            flags |= libc::MAP_HUGETLB;
        }
        // SAFETY: an anonymous mapping at an address the kernel chooses touches no existing
        // memory; the result is checked against MAP_FAILED.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(MemoryError::Map {
                len,
                source: io::Error::last_os_error(),
            });
        }
        let ptr = NonNull::new(addr.cast::<u8>()).ok_or(MemoryError::Map {
            len,
            source: io::Error::from_raw_os_error(libc::EFAULT),
        })?;
        // From here on, Drop unmaps on every error path.
        let mut buf = Self {
            ptr,
            len,
            map_len,
            huge,
            binding: Binding::Default,
        };
        if !huge {
            // SAFETY: the range is our own fresh mapping; MADV_HUGEPAGE is only a hint.
            unsafe { libc::madvise(addr, map_len, libc::MADV_HUGEPAGE) };
        }
        if let Some(node) = node {
            buf.binding = bind(addr, map_len, node)?;
        }
        buf.populate(node)?;
        Ok(buf)
    }

    /// Faults every page in so the policy places it now, not on first use by a worker.
    fn populate(&mut self, node: Option<NodeId>) -> Result<(), MemoryError> {
        // SAFETY: the range is our own mapping; MADV_POPULATE_WRITE only faults pages in.
        let rc =
            unsafe { libc::madvise(self.ptr.as_ptr().cast(), self.map_len, MADV_POPULATE_WRITE) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINVAL) || self.huge {
            return Err(MemoryError::Populate {
                len: self.len,
                node,
                source: err,
            });
        }
        // Kernels before 5.14: touch one byte per page instead.
        let step = page_size();
        let mut off = 0;
        while off < self.map_len {
            // SAFETY: `off < map_len`, inside our writable mapping.
            unsafe { self.ptr.as_ptr().add(off).write_volatile(0) };
            off += step;
        }
        Ok(())
    }

    /// Length in bytes as requested.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty (never: construction rejects zero).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether hugetlbfs pages back the buffer.
    pub fn is_huge(&self) -> bool {
        self.huge
    }

    /// How the buffer was placed.
    pub fn binding(&self) -> Binding {
        self.binding
    }

    /// Start of the buffer.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Start of the buffer, writable.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The buffer's bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes owned by self for its lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The buffer's bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Where the kernel says the buffer's pages are.
    pub fn locate(&self) -> Result<PageLocations, MemoryError> {
        // SAFETY: the range is our own live mapping.
        unsafe { locate_pages(self.ptr.as_ptr(), self.len, usize::MAX) }
    }
}

impl Drop for NodeBuffer {
    fn drop(&mut self) {
        // SAFETY: ptr/map_len are exactly the mapping created in `map`, unmapped only here.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.map_len) };
    }
}

/// A node mask holding `node`, and the `maxnode` argument that covers it
/// (the kernel reads `maxnode - 1` bits).
fn node_mask(node: NodeId) -> (Vec<u64>, libc::c_ulong) {
    let bits = u64::BITS as usize;
    let mut mask = vec![0u64; node / bits + 1];
    mask[node / bits] |= 1 << (node % bits);
    let maxnode = (mask.len() * bits + 1) as libc::c_ulong;
    (mask, maxnode)
}

/// While alive, memory this thread allocates — anonymous pages, and the
/// pages of shared memory (a memfd) it writes or faults in first — comes
/// from `node` where it has room (`set_mempolicy(MPOL_PREFERRED)`); the
/// thread's default policy (local allocation) comes back on drop. Where
/// the kernel has no memory policies (ENOSYS, qemu-user) it changes
/// nothing.
#[derive(Debug)]
pub struct PreferNode {
    set: bool,
}

impl PreferNode {
    /// Prefers `node` for this thread's allocations until the guard drops.
    pub fn new(node: NodeId) -> io::Result<PreferNode> {
        let (mask, maxnode) = node_mask(node);
        // SAFETY: mask outlives the call and holds maxnode - 1 bits.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_set_mempolicy,
                libc::MPOL_PREFERRED as libc::c_ulong,
                mask.as_ptr(),
                maxnode,
            )
        };
        if rc == 0 {
            return Ok(PreferNode { set: true });
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ENOSYS) {
            return Ok(PreferNode { set: false });
        }
        Err(err)
    }
}

impl Drop for PreferNode {
    fn drop(&mut self) {
        if self.set {
            // SAFETY: MPOL_DEFAULT takes no mask.
            unsafe {
                libc::syscall(
                    libc::SYS_set_mempolicy,
                    libc::MPOL_DEFAULT as libc::c_ulong,
                    std::ptr::null::<u64>(),
                    0 as libc::c_ulong,
                )
            };
        }
    }
}

fn bind(addr: *mut libc::c_void, len: usize, node: NodeId) -> Result<Binding, MemoryError> {
    let (mask, maxnode) = node_mask(node);
    // SAFETY: addr/len is a mapping owned by the caller; mask outlives the call and holds
    // maxnode - 1 bits.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr,
            len as libc::c_ulong,
            libc::MPOL_BIND as libc::c_ulong,
            mask.as_ptr(),
            maxnode,
            0 as libc::c_ulong,
        )
    };
    if rc == 0 {
        return Ok(Binding::Bound(node));
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ENOSYS) {
        log::warn!("mbind is not available (ENOSYS); memory for node {node} is not bound");
        return Ok(Binding::Unsupported(node));
    }
    Err(MemoryError::Bind { node, source: err })
}

/// Where the pages of a memory range live, from `move_pages`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageLocations {
    /// Sampled resident pages per node.
    pub per_node: BTreeMap<NodeId, u64>,
    /// Sampled pages not resident (never touched, or swapped out).
    pub not_present: u64,
    /// Pages sampled.
    pub sampled: u64,
}

impl PageLocations {
    /// Builds locations from (node, pages) counts; for callers that already know, and tests.
    pub fn from_counts(counts: impl IntoIterator<Item = (NodeId, u64)>) -> Self {
        let mut per_node = BTreeMap::new();
        for (node, pages) in counts {
            *per_node.entry(node).or_insert(0) += pages;
        }
        let sampled = per_node.values().sum();
        Self {
            per_node,
            not_present: 0,
            sampled,
        }
    }

    /// The node holding the most resident pages (ties: lower node id), if any page is resident.
    pub fn majority_node(&self) -> Option<NodeId> {
        self.per_node
            .iter()
            .filter(|(_, pages)| **pages > 0)
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(node, _)| *node)
    }
}

/// Pages sampled by default when locating a guest's memory: enough to see a split to within a
/// fraction of a percent, cheap enough (one move_pages call per 1024 pages) to run at startup.
pub const DEFAULT_SAMPLES: usize = 4096;

/// Asks the kernel which node holds each of up to `max_samples` pages spread evenly over
/// `[addr, addr + len)`. Guest memory is large, so sampling a few thousand pages is enough to
/// find where it lives.
///
/// # Safety
///
/// `[addr, addr + len)` must be mapped in this process for the duration of the call (the
/// kernel only reads page tables, but an unmapped range yields meaningless answers).
pub unsafe fn locate_pages(
    addr: *const u8,
    len: usize,
    max_samples: usize,
) -> Result<PageLocations, MemoryError> {
    let page = page_size();
    let start = addr as usize & !(page - 1);
    let pages = (addr as usize + len).div_ceil(page) - start / page;
    let samples = pages.min(max_samples.max(1));
    let stride = pages.div_ceil(samples.max(1)).max(1);
    let addrs: Vec<*const libc::c_void> = (0..pages)
        .step_by(stride)
        .map(|i| (start + i * page) as *const libc::c_void)
        .collect();
    let mut status = vec![0 as libc::c_int; addrs.len()];
    let mut out = PageLocations::default();
    for (chunk, stat) in addrs.chunks(1024).zip(status.chunks_mut(1024)) {
        // SAFETY: chunk and stat have equal lengths and live across the call; nodes = NULL
        // asks only for the status, moving nothing; pid 0 is this process.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_move_pages,
                0 as libc::c_int,
                chunk.len() as libc::c_ulong,
                chunk.as_ptr(),
                std::ptr::null::<libc::c_int>(),
                stat.as_mut_ptr(),
                0 as libc::c_int,
            )
        };
        if rc < 0 {
            return Err(MemoryError::Locate {
                source: io::Error::last_os_error(),
            });
        }
    }
    for s in status {
        out.sampled += 1;
        match usize::try_from(s) {
            Ok(node) => *out.per_node.entry(node).or_insert(0) += 1,
            Err(_) => out.not_present += 1,
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// move_pages/mbind need a NUMA kernel; qemu-user answers ENOSYS.
    fn numa_syscalls_work() -> bool {
        let probe = [0u8; 1];
        // SAFETY: probe is a live stack array.
        match unsafe { locate_pages(probe.as_ptr(), 1, 1) } {
            Ok(_) => true,
            Err(MemoryError::Locate { source }) => {
                assert_eq!(source.raw_os_error(), Some(libc::ENOSYS), "{source}");
                false
            }
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn bound_buffer_lives_on_node_zero() {
        let mut buf = NodeBuffer::new(1 << 20, Some(0), PageSize::Normal).unwrap();
        buf.as_mut_slice()[12345] = 7;
        assert_eq!(buf.as_slice()[12345], 7);
        assert_eq!(buf.as_ptr() as usize % page_size(), 0);
        if numa_syscalls_work() {
            assert_eq!(buf.binding(), Binding::Bound(0));
            let loc = buf.locate().unwrap();
            assert_eq!(loc.per_node.get(&0).copied(), Some(loc.sampled));
            assert_eq!(loc.sampled, (1 << 20) / page_size() as u64);
            assert_eq!(loc.majority_node(), Some(0));
        } else {
            // Without move_pages (qemu-user) mbind may still exist; either way node 0 was asked.
            assert!(matches!(
                buf.binding(),
                Binding::Unsupported(0) | Binding::Bound(0)
            ));
        }
    }

    /// Memory a thread touches first while it prefers a node lands there;
    /// a node the host lacks is an error (where the kernel has policies).
    #[test]
    fn a_thread_preferring_node_zero_allocates_there() {
        let guard = PreferNode::new(0).unwrap();
        let len = 1 << 20;
        let mut v = vec![0u8; len];
        v.iter_mut().step_by(page_size()).for_each(|b| *b = 1);
        if numa_syscalls_work() {
            // SAFETY: `v` is mapped for the whole call.
            let loc = unsafe { locate_pages(v.as_ptr(), len, DEFAULT_SAMPLES) }.unwrap();
            assert_eq!(loc.majority_node(), Some(0));
            drop(guard);
            assert!(PreferNode::new(1000).is_err());
        }
    }

    #[test]
    fn huge_pages_fall_back_to_base_pages() {
        let buf = NodeBuffer::new(3 << 20, Some(0), PageSize::HugeIfAvailable).unwrap();
        assert_eq!(buf.len(), 3 << 20);
        if numa_syscalls_work() {
            assert_eq!(buf.locate().unwrap().majority_node(), Some(0));
        }
        match NodeBuffer::new(2 << 20, None, PageSize::Huge) {
            Ok(b) => assert!(b.is_huge()),
            Err(e) => assert!(e.to_string().contains("nr_hugepages"), "{e}"),
        }
    }

    #[test]
    fn rejects_empty_and_missing_nodes() {
        assert!(matches!(
            NodeBuffer::new(0, None, PageSize::Normal),
            Err(MemoryError::Empty)
        ));
        if numa_syscalls_work() {
            let err = NodeBuffer::new(4096, Some(1000), PageSize::Normal).unwrap_err();
            assert!(matches!(err, MemoryError::Bind { node: 1000, .. }), "{err}");
        }
    }

    #[test]
    fn untouched_pages_are_reported_not_present() {
        let page = page_size();
        // SAFETY: fresh anonymous mapping, checked below, unmapped at the end.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        // SAFETY: the first page of our mapping.
        unsafe { addr.cast::<u8>().write(1) };
        if numa_syscalls_work() {
            // SAFETY: the mapping is live.
            let loc = unsafe { locate_pages(addr.cast(), 4 * page, 64) }.unwrap();
            assert_eq!(loc.sampled, 4);
            assert_eq!(loc.not_present, 3);
            assert_eq!(loc.majority_node(), Some(0));
        }
        // SAFETY: unmapping our own mapping.
        unsafe { libc::munmap(addr, 4 * page) };
    }

    #[test]
    fn majority_breaks_ties_towards_lower_nodes() {
        let loc = PageLocations::from_counts([(3, 5), (1, 5), (2, 1)]);
        assert_eq!(loc.majority_node(), Some(1));
        assert_eq!(PageLocations::default().majority_node(), None);
    }
}
