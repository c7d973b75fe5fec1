//! POSIX ACLs as JuiceFS stores them (volumes formatted with `--enable-acl`),
//! and the rules that use them, written once for both engines.
//!
//! A rule ([`Rule`]) is stored once per distinct content under a 32-bit id
//! (SQLite: a `jfs_acl` row; Redis: a field of the `acl` hash, the id from
//! the `aclMaxId` counter) and never changed: a node names its access and
//! default rules by id (`Attr::access_acl`, `Attr::default_acl`; 0 = none),
//! and a change makes or finds another rule. So a rule read once can be
//! kept for good ([`RuleCache`]).
//!
//! The node's mode stays the ACL's summary, as Linux keeps it: the owner
//! and other bits are the `user::` and `other::` entries, the group bits
//! the `mask::` entry (or `group::` where the ACL has no mask). Rules of
//! the form `owner, group, other` alone ("minimal") are not stored: they
//! are the mode.
//!
//! The kernel speaks ACLs as the `system.posix_acl_access` and
//! `system.posix_acl_default` attributes in Linux's `posix_acl_xattr`
//! layout ([`Rule::from_xattr`], [`Rule::to_xattr`]).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Error, Result};

/// A perm field that is not set (JuiceFS `0xFFFF`): no mask, or an entry
/// the caller left out.
pub const UNSET: u16 = 0xFFFF;

/// The attribute name of a node's access ACL.
pub const XATTR_ACCESS: &[u8] = b"system.posix_acl_access";
/// The attribute name of a directory's default ACL.
pub const XATTR_DEFAULT: &[u8] = b"system.posix_acl_default";

/// Which of a node's two ACLs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AclType {
    /// The ACL that decides access to the node.
    Access,
    /// A directory's ACL that new entries inherit.
    Default,
}

impl AclType {
    /// The type an attribute name stands for, if it names an ACL.
    pub fn of_xattr(name: &[u8]) -> Option<AclType> {
        match name {
            XATTR_ACCESS => Some(AclType::Access),
            XATTR_DEFAULT => Some(AclType::Default),
            _ => None,
        }
    }

    /// The attribute name of this type.
    pub fn xattr_name(self) -> &'static [u8] {
        match self {
            AclType::Access => XATTR_ACCESS,
            AclType::Default => XATTR_DEFAULT,
        }
    }
}

/// The id of a node's ACL of type `typ` (0: none).
pub fn acl_id(a: &crate::meta::Attr, typ: AclType) -> u32 {
    match typ {
        AclType::Access => a.access_acl,
        AclType::Default => a.default_acl,
    }
}

/// A named user's or group's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AclEntry {
    /// The uid or gid.
    pub id: u32,
    /// `rwx` bits.
    pub perm: u16,
}

/// One ACL (JuiceFS `acl.Rule`): the owner, owning group, mask and other
/// perms (each [`UNSET`] where absent) and the named users and groups,
/// sorted by id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// `user::` perms.
    pub owner: u16,
    /// `group::` perms.
    pub group: u16,
    /// `mask::` perms, or [`UNSET`].
    pub mask: u16,
    /// `other::` perms.
    pub other: u16,
    /// `user:ID:` entries.
    pub named_users: Vec<AclEntry>,
    /// `group:ID:` entries.
    pub named_groups: Vec<AclEntry>,
}

/// Most entries a rule may hold (Linux's xattr size limit, 64 KiB, holds
/// 8,191 of 8 bytes; ext4 keeps fewer): a bound on what a caller or a
/// damaged store can make us allocate.
pub const MAX_ENTRIES: usize = 8191;

/// Linux `posix_acl_xattr` version.
const XATTR_VERSION: u32 = 2;
const TAG_USER_OBJ: u16 = 0x01;
const TAG_USER: u16 = 0x02;
const TAG_GROUP_OBJ: u16 = 0x04;
const TAG_GROUP: u16 = 0x08;
const TAG_MASK: u16 = 0x10;
const TAG_OTHER: u16 = 0x20;
const UNDEFINED_ID: u32 = u32::MAX;

impl Rule {
    /// A rule with nothing set (JuiceFS `EmptyRule`): removing an ACL.
    pub fn empty() -> Rule {
        Rule {
            owner: UNSET,
            group: UNSET,
            mask: UNSET,
            other: UNSET,
            named_users: Vec::new(),
            named_groups: Vec::new(),
        }
    }

    /// Nothing set: the caller removes the ACL.
    pub fn is_empty(&self) -> bool {
        self.named_users.is_empty()
            && self.named_groups.is_empty()
            && self.owner & self.group & self.other & self.mask == UNSET
    }

    /// Owner, group and other alone: what the mode says, stored as no ACL.
    pub fn is_minimal(&self) -> bool {
        self.named_users.is_empty() && self.named_groups.is_empty() && self.mask == UNSET
    }

    /// The permission bits of the mode this rule summarises (group bits:
    /// the mask, or the owning group's perms without one).
    pub fn mode(&self) -> u16 {
        let g = if self.is_minimal() {
            self.group
        } else {
            self.mask
        };
        ((self.owner & 7) << 6) | ((g & 7) << 3) | (self.other & 7)
    }

    /// A chmod of a node with this ACL: the owner, other, and the mask (or
    /// the group without one) take the new mode's bits (JuiceFS `SetMode`).
    pub fn set_mode(&mut self, mode: u16) {
        self.owner = (self.owner & 0xFFF8) | ((mode >> 6) & 7);
        if self.is_minimal() {
            self.group = (self.group & 0xFFF8) | ((mode >> 3) & 7);
        } else {
            self.mask = (self.mask & 0xFFF8) | ((mode >> 3) & 7);
        }
        self.other = (self.other & 0xFFF8) | (mode & 7);
    }

    /// Fills the owner, group and other entries a caller left out from the
    /// node's mode (JuiceFS `InheritPerms`).
    pub fn inherit_perms(&mut self, mode: u16) {
        if self.owner == UNSET {
            self.owner = (mode >> 6) & 7;
        }
        if self.group == UNSET {
            self.group = (mode >> 3) & 7;
        }
        if self.other == UNSET {
            self.other = mode & 7;
        }
    }

    /// The access ACL a new node gets from its directory's default ACL
    /// (this rule) and the mode it was created with, as Linux's
    /// `posix_acl_create`: the owner, mask and other entries are and'ed
    /// with the mode's bits.
    pub fn child_access(&self, mode: u16) -> Rule {
        Rule {
            owner: (mode >> 6) & 7 & self.owner,
            group: self.group,
            mask: (mode >> 3) & 7 & self.mask,
            other: mode & 7 & self.other,
            named_users: self.named_users.clone(),
            named_groups: self.named_groups.clone(),
        }
    }

    /// Whether a caller (`uid`, groups `gids`) has every bit of `want` on a
    /// node owned by `owner_uid`:`owner_gid` with this access ACL — Linux's
    /// `posix_acl_permission`: the owner entry for the owner, a named user's
    /// entry (masked), then any matching group entry (masked) grants, and
    /// a caller in a matching group that none grants is refused; other
    /// callers get the other entry.
    pub fn permits(
        &self,
        uid: u32,
        gids: &[u32],
        owner_uid: u32,
        owner_gid: u32,
        want: u8,
    ) -> bool {
        let has = |perm: u16| (perm & 7) as u8 & want == want;
        if uid == owner_uid {
            return has(self.owner);
        }
        if let Some(e) = self.named_users.iter().find(|e| e.id == uid) {
            return has(e.perm & self.mask);
        }
        let mut matched = false;
        if gids.contains(&owner_gid) {
            if has(self.group & self.mask) {
                return true;
            }
            matched = true;
        }
        for e in &self.named_groups {
            if gids.contains(&e.id) {
                if has(e.perm & self.mask) {
                    return true;
                }
                matched = true;
            }
        }
        !matched && has(self.other)
    }

    /// JuiceFS's stored form (big-endian): owner, group, mask, other (u16
    /// each), then the count and (id u32, perm u16) of the named users,
    /// then of the named groups.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(16 + 6 * (self.named_users.len() + self.named_groups.len()));
        for p in [self.owner, self.group, self.mask, self.other] {
            b.extend_from_slice(&p.to_be_bytes());
        }
        for list in [&self.named_users, &self.named_groups] {
            b.extend_from_slice(&(list.len() as u32).to_be_bytes());
            b.extend_from_slice(&encode_entries(list));
        }
        b
    }

    /// Decodes [`Rule::encode`]'s form; a value of another shape is
    /// corrupt (`what` names it in the error).
    pub fn decode(b: &[u8], what: &str) -> Result<Rule> {
        let bad = || Error::Corrupt(format!("{what}: {} bytes are not an ACL rule", b.len()));
        let mut r = Reader(b);
        let owner = r.u16().ok_or_else(bad)?;
        let group = r.u16().ok_or_else(bad)?;
        let mask = r.u16().ok_or_else(bad)?;
        let other = r.u16().ok_or_else(bad)?;
        let mut lists = [Vec::new(), Vec::new()];
        for list in &mut lists {
            let n = r.u32().ok_or_else(bad)? as usize;
            if n > MAX_ENTRIES || r.0.len() < n * 6 {
                return Err(bad());
            }
            for _ in 0..n {
                let id = r.u32().ok_or_else(bad)?;
                let perm = r.u16().ok_or_else(bad)?;
                list.push(AclEntry { id, perm });
            }
        }
        if !r.0.is_empty() {
            return Err(bad());
        }
        let [named_users, named_groups] = lists;
        Ok(Rule {
            owner,
            group,
            mask,
            other,
            named_users,
            named_groups,
        })
    }

    /// Linux's `posix_acl_xattr` form of the rule (little-endian: version
    /// 2, then tag, perm, id per entry, in the kernel's order).
    pub fn to_xattr(&self) -> Vec<u8> {
        let mut b =
            Vec::with_capacity(4 + 8 * (5 + self.named_users.len() + self.named_groups.len()));
        b.extend_from_slice(&XATTR_VERSION.to_le_bytes());
        let mut put = |tag: u16, perm: u16, id: u32| {
            b.extend_from_slice(&tag.to_le_bytes());
            b.extend_from_slice(&perm.to_le_bytes());
            b.extend_from_slice(&id.to_le_bytes());
        };
        put(TAG_USER_OBJ, self.owner, UNDEFINED_ID);
        for e in &self.named_users {
            put(TAG_USER, e.perm, e.id);
        }
        put(TAG_GROUP_OBJ, self.group, UNDEFINED_ID);
        for e in &self.named_groups {
            put(TAG_GROUP, e.perm, e.id);
        }
        if self.mask != UNSET {
            put(TAG_MASK, self.mask, UNDEFINED_ID);
        }
        put(TAG_OTHER, self.other, UNDEFINED_ID);
        b
    }

    /// Parses a `posix_acl_xattr` value as a caller sets it: `Invalid`
    /// (EINVAL) for a wrong version or length, an unknown tag, perms
    /// beyond `rwx`, a repeated entry, or named entries without a mask.
    /// An ACL that leaves out the owner, group or other entry is accepted
    /// with them [`UNSET`] (see [`Rule::inherit_perms`]); an empty value
    /// is [`Rule::empty`].
    pub fn from_xattr(b: &[u8]) -> Result<Rule> {
        let invalid = |why: &str| Error::Invalid(format!("POSIX ACL attribute: {why}"));
        if b.len() < 4 || b.len() % 8 != 4 {
            return Err(invalid("its length is not 4 + 8 per entry"));
        }
        if u32::from_le_bytes([b[0], b[1], b[2], b[3]]) != XATTR_VERSION {
            return Err(invalid("not version 2"));
        }
        if (b.len() - 4) / 8 > MAX_ENTRIES {
            return Err(invalid("too many entries"));
        }
        let mut r = Rule::empty();
        for e in b[4..].chunks_exact(8) {
            let tag = u16::from_le_bytes([e[0], e[1]]);
            let perm = u16::from_le_bytes([e[2], e[3]]);
            let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
            if perm & !7 != 0 {
                return Err(invalid("perms beyond rwx"));
            }
            let once = |slot: &mut u16| {
                if *slot != UNSET {
                    return Err(invalid("an entry given twice"));
                }
                *slot = perm;
                Ok(())
            };
            match tag {
                TAG_USER_OBJ => once(&mut r.owner)?,
                TAG_GROUP_OBJ => once(&mut r.group)?,
                TAG_MASK => once(&mut r.mask)?,
                TAG_OTHER => once(&mut r.other)?,
                TAG_USER => r.named_users.push(AclEntry { id, perm }),
                TAG_GROUP => r.named_groups.push(AclEntry { id, perm }),
                _ => return Err(invalid("an unknown tag")),
            }
        }
        for list in [&mut r.named_users, &mut r.named_groups] {
            list.sort_unstable();
            if list.windows(2).any(|w| w[0].id == w[1].id) {
                return Err(invalid("a user or group named twice"));
            }
        }
        if r.mask == UNSET && !(r.named_users.is_empty() && r.named_groups.is_empty()) {
            return Err(invalid("named entries need a mask entry"));
        }
        Ok(r)
    }
}

fn encode_entries(list: &[AclEntry]) -> Vec<u8> {
    let mut b = Vec::with_capacity(list.len() * 6);
    for e in list {
        b.extend_from_slice(&e.id.to_be_bytes());
        b.extend_from_slice(&e.perm.to_be_bytes());
    }
    b
}

/// JuiceFS's SQL form of a list of named entries (`named_users`,
/// `named_groups` columns): (id u32, perm u16) big-endian, no count.
pub fn encode_named(list: &[AclEntry]) -> Vec<u8> {
    encode_entries(list)
}

/// Decodes [`encode_named`]'s form (`what` names it in an error).
pub fn decode_named(b: &[u8], what: &str) -> Result<Vec<AclEntry>> {
    if !b.len().is_multiple_of(6) || b.len() / 6 > MAX_ENTRIES {
        return Err(Error::Corrupt(format!(
            "{what}: {} bytes are not a list of ACL entries",
            b.len()
        )));
    }
    Ok(b.chunks_exact(6)
        .map(|c| AclEntry {
            id: u32::from_be_bytes([c[0], c[1], c[2], c[3]]),
            perm: u16::from_be_bytes([c[4], c[5]]),
        })
        .collect())
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
    fn u16(&mut self) -> Option<u16> {
        self.take::<2>().map(u16::from_be_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take::<4>().map(u32::from_be_bytes)
    }
}

/// The rules this client has read or made, by id both ways. Rules never
/// change once stored, so an entry stays true; the reverse map lets a new
/// node or a chmod reuse the id of a rule that exists (a rule made by
/// another client meanwhile may get a second id: harmless, as in JuiceFS).
#[derive(Debug, Default)]
pub struct RuleCache {
    inner: Mutex<CacheInner>,
}

#[derive(Debug, Default)]
struct CacheInner {
    by_id: HashMap<u32, Arc<Rule>>,
    by_rule: HashMap<Arc<Rule>, u32>,
}

/// Most rules kept: a volume holds few distinct ACLs; past this the cache
/// starts again rather than grow without bound.
const MAX_CACHED: usize = 65_536;

impl RuleCache {
    /// The rule stored under `id`, if read before.
    pub fn get(&self, id: u32) -> Option<Arc<Rule>> {
        self.inner.lock().by_id.get(&id).cloned()
    }

    /// The id of a rule with this content, if known.
    pub fn id_of(&self, rule: &Rule) -> Option<u32> {
        self.inner.lock().by_rule.get(rule).copied()
    }

    /// Records that `id` holds `rule`.
    pub fn put(&self, id: u32, rule: Rule) -> Arc<Rule> {
        let mut c = self.inner.lock();
        if c.by_id.len() >= MAX_CACHED {
            c.by_id.clear();
            c.by_rule.clear();
        }
        let rule = Arc::new(rule);
        c.by_id.insert(id, rule.clone());
        c.by_rule.entry(rule.clone()).or_insert(id);
        rule
    }
}

#[cfg(test)]
mod tests;
