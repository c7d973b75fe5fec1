//! Filling an empty Redis store from a dump (`sluice load`) and reading the
//! counters for `sluice dump`. Records go out in pipelines of a few
//! thousand commands; the settings key is written last, so a load that
//! stops half way leaves keys but no volume.

use redis::Pipeline;

use super::Inner;
use super::codec::{encode_attr, encode_entry};
use super::keys::{counter, slice_field};
use crate::error::{Error, Result};
use crate::format::Format;
use crate::meta::settings;
use crate::meta::{Attr, Counters, DirQuota, DirStat, FileType, Ino, Restore, Slice};

/// Commands sent in one pipeline.
const PIPELINE_LEN: usize = 2048;

impl Inner {
    /// The counters with JuiceFS's dump semantics: Redis keeps the last
    /// inode and slice id handed out, a dump names the next ones.
    pub(super) fn counters(&self) -> Result<Counters> {
        Ok(Counters {
            used_space: self.counter_value(counter::USED_SPACE)?,
            used_inodes: self.counter_value(counter::TOTAL_INODES)?,
            next_inode: self.counter_value(counter::NEXT_INODE)? + 1,
            next_slice: self.counter_value(counter::NEXT_SLICE)? + 1,
            next_session: self.counter_value(counter::NEXT_SESSION)?,
            next_trash: self.counter_value(counter::NEXT_TRASH)?,
        })
    }

    /// Begins a load: the database (or, on a cluster, the volume's hash
    /// tag) must hold nothing.
    pub(super) fn restore(&self) -> Result<RedisRestore<'_>> {
        let prefix = self.keys.prefix().to_string();
        let found: Vec<String> = self.pool.with_conn(|c| {
            if prefix.is_empty() {
                let n: u64 = redis::cmd("DBSIZE").query(c)?;
                return Ok(if n > 0 {
                    vec![format!("{n} keys")]
                } else {
                    vec![]
                });
            }
            let (_, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(0)
                .arg("MATCH")
                .arg(format!("{prefix}*"))
                .arg("COUNT")
                .arg(10_000)
                .query(c)?;
            Ok(keys)
        })?;
        let exists: bool = self.pool.with_conn(|c| {
            redis::cmd("EXISTS")
                .arg(self.keys.setting())
                .arg(self.keys.inode(crate::meta::ROOT_INO))
                .query::<u64>(c)
                .map(|n| n > 0)
        })?;
        if exists || !found.is_empty() {
            return Err(Error::Invalid(format!(
                "the Redis database {} is not empty; load into an empty database \
                 (FLUSHDB after checking it holds nothing you need)",
                self.addr
            )));
        }
        Ok(RedisRestore {
            inner: self,
            pipe: redis::pipe(),
            queued: 0,
            acls: std::collections::HashMap::new(),
        })
    }
}

/// A load into Redis in progress.
pub(super) struct RedisRestore<'a> {
    inner: &'a Inner,
    pipe: Pipeline,
    queued: usize,
    /// The ACL rules stored so far, with their ids (1, 2, …).
    acls: std::collections::HashMap<crate::meta::acl::Rule, u32>,
}

impl RedisRestore<'_> {
    fn queued(&mut self) -> Result<()> {
        self.queued += 1;
        if self.queued >= PIPELINE_LEN {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.queued == 0 {
            return Ok(());
        }
        // Every command queued is idempotent (SET, HSET, DEL before RPUSH),
        // so a retry after a lost connection writes the same records.
        let pipe = std::mem::replace(&mut self.pipe, redis::pipe());
        self.inner
            .pool
            .with_conn(|c| pipe.query::<()>(c))
            .map_err(|e| Error::Meta(format!("writing the loaded records: {e}")))?;
        self.queued = 0;
        Ok(())
    }
}

impl Restore for RedisRestore<'_> {
    fn node(&mut self, ino: Ino, attr: &Attr, parents: &[(Ino, u32)]) -> Result<()> {
        let keys = &self.inner.keys;
        self.pipe
            .cmd("SET")
            .arg(keys.inode(ino))
            .arg(encode_attr(attr, 0))
            .ignore();
        self.queued()?;
        if parents.len() > 1 || parents.iter().any(|&(_, n)| n > 1) {
            let key = self.inner.keys.parent(ino);
            for &(parent, links) in parents {
                self.pipe
                    .cmd("HSET")
                    .arg(&key)
                    .arg(parent.to_string())
                    .arg(links)
                    .ignore();
                self.queued()?;
            }
        }
        Ok(())
    }

    fn entry(&mut self, parent: Ino, name: &[u8], ino: Ino, typ: FileType) -> Result<()> {
        self.pipe
            .cmd("HSET")
            .arg(self.inner.keys.entry(parent))
            .arg(name)
            .arg(&encode_entry(typ, ino)[..])
            .ignore();
        self.queued()
    }

    fn symlink(&mut self, ino: Ino, target: &[u8]) -> Result<()> {
        self.pipe
            .cmd("SET")
            .arg(self.inner.keys.symlink(ino))
            .arg(target)
            .ignore();
        self.queued()
    }

    fn acl(&mut self, rule: &crate::meta::acl::Rule) -> Result<u32> {
        if rule.is_empty() {
            return Ok(0);
        }
        if let Some(&id) = self.acls.get(rule) {
            return Ok(id);
        }
        let id = self.acls.len() as u32 + 1;
        self.acls.insert(rule.clone(), id);
        self.pipe
            .cmd("HSET")
            .arg(self.inner.keys.acl())
            .arg(id)
            .arg(rule.encode())
            .ignore();
        self.queued()?;
        Ok(id)
    }

    fn xattr(&mut self, ino: Ino, name: &[u8], value: &[u8]) -> Result<()> {
        self.pipe
            .cmd("HSET")
            .arg(self.inner.keys.xattr(ino))
            .arg(name)
            .arg(value)
            .ignore();
        self.queued()
    }

    fn chunk(&mut self, ino: Ino, indx: u32, slices: &[Slice]) -> Result<()> {
        if slices.is_empty() {
            return Ok(());
        }
        let key = self.inner.keys.chunk(ino, indx);
        self.pipe.cmd("DEL").arg(&key).ignore();
        let mut push = redis::cmd("RPUSH");
        push.arg(&key);
        for s in slices {
            push.arg(&s.encode()[..]);
        }
        self.pipe.add_command(push).ignore();
        self.queued()
    }

    fn slice_refs(&mut self, id: u64, size: u32, refs: u32) -> Result<()> {
        // A slice named once has no field; the field holds references − 1.
        if refs <= 1 {
            return Ok(());
        }
        self.pipe
            .cmd("HSET")
            .arg(self.inner.keys.slice_refs())
            .arg(slice_field(id, size))
            .arg(refs - 1)
            .ignore();
        self.queued()
    }

    fn dir_stat(&mut self, ino: Ino, stat: &DirStat) -> Result<()> {
        let keys = &self.inner.keys;
        let field = ino.to_string();
        for (key, value) in [
            (keys.dir_data_length(), stat.data_length),
            (keys.dir_used_space(), stat.used_space),
            (keys.dir_used_inodes(), stat.used_inodes),
        ] {
            self.pipe
                .cmd("HSET")
                .arg(key)
                .arg(&field)
                .arg(value)
                .ignore();
        }
        self.queued()
    }

    fn dir_quota(&mut self, ino: Ino, q: &DirQuota) -> Result<()> {
        let [quota, used_space, used_inodes] = self.inner.keys.dir_quota_keys();
        let field = ino.to_string();
        self.pipe
            .cmd("HSET")
            .arg(quota)
            .arg(&field)
            .arg(&super::dir_quota::pack(q.max_space, q.max_inodes)[..])
            .ignore();
        self.pipe
            .cmd("HSET")
            .arg(used_space)
            .arg(&field)
            .arg(q.used_space)
            .ignore();
        self.pipe
            .cmd("HSET")
            .arg(used_inodes)
            .arg(&field)
            .arg(q.used_inodes)
            .ignore();
        self.queued()
    }

    fn finish(mut self: Box<Self>, format: &Format, counters: &Counters) -> Result<()> {
        let keys = &self.inner.keys;
        for (name, value) in [
            (counter::NEXT_INODE, counters.next_inode - 1),
            (counter::NEXT_SLICE, counters.next_slice - 1),
            (counter::NEXT_SESSION, counters.next_session),
            (counter::USED_SPACE, counters.used_space),
            (counter::TOTAL_INODES, counters.used_inodes),
            (counter::NEXT_TRASH, counters.next_trash),
            (counter::ACL_MAX_ID, self.acls.len() as i64),
        ] {
            self.pipe
                .cmd("SET")
                .arg(keys.counter(name))
                .arg(value.max(0))
                .ignore();
        }
        self.queued += 1;
        // Everything else is stored before the settings make it a volume.
        self.flush()?;
        let json = settings::to_json(format)?;
        let setting = self.inner.keys.setting();
        self.inner
            .pool
            .with_conn(|c| redis::cmd("SET").arg(&setting).arg(&json).query::<()>(c))
            .map_err(|e| match e {
                Error::Meta(m) => Error::Meta(format!("writing the volume settings: {m}")),
                e => e,
            })?;
        Ok(())
    }
}
