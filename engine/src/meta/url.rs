//! Metadata URLs: which engine a volume's metadata lives in, as JuiceFS
//! spells it (`sqlite3://PATH`, `redis://HOST:PORT/DB`, ...).

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::meta::Meta;
use crate::meta::sqlite::SqliteMeta;

/// Opens the metadata engine a URL names. Only `sqlite3://PATH` is served
/// today (`sqlite3:///abs/path.db` or `sqlite3://relative.db`; JuiceFS's
/// driver options after `?` are accepted and ignored).
pub fn open_meta(url: &str) -> Result<Arc<dyn Meta>> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(Error::Invalid(format!(
            "metadata URL {url:?} has no scheme; use sqlite3://PATH"
        )));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "sqlite3" | "sqlite" => {
            let path = rest.split_once('?').map_or(rest, |(p, _)| p);
            if path.is_empty() {
                return Err(Error::Invalid(format!(
                    "metadata URL {url:?} names no database file; use sqlite3://PATH"
                )));
            }
            Ok(Arc::new(SqliteMeta::open(path)?))
        }
        "redis" | "rediss" | "unix" => Err(Error::NotSupported(format!(
            "the Redis metadata engine ({scheme}://) is not supported yet; use sqlite3://PATH"
        ))),
        "mysql" | "postgres" | "tikv" | "etcd" | "badger" | "fdb" | "memkv" => {
            Err(Error::NotSupported(format!(
                "the {scheme} metadata engine is not supported; use sqlite3://PATH"
            )))
        }
        _ => Err(Error::Invalid(format!(
            "unknown metadata engine {scheme:?} in {url:?}; use sqlite3://PATH"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str) -> String {
        match open_meta(url) {
            Ok(m) => panic!("{url} opened {m:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn sqlite_urls_open_a_database() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("meta.db");
        let m = open_meta(&format!("sqlite3://{}?cache=shared", path.display())).expect("open");
        assert_eq!(m.name(), "sqlite3");
        assert!(path.exists());
    }

    #[test]
    fn other_urls_get_one_clear_line() {
        assert!(err("redis://localhost:6379/1").contains("not supported yet"));
        assert!(err("mysql://u:p@(h:3306)/db").contains("not supported"));
        assert!(err("/tmp/x.db").contains("no scheme"));
        assert!(err("ftp://x").contains("unknown metadata engine"));
        assert!(err("sqlite3://").contains("names no database"));
        assert!(err("sqlite3:///nonexistent-dir-xyz/a.db").contains("does not exist"));
        for url in ["redis://h", "/tmp/x.db", "ftp://x"] {
            assert!(!err(url).contains('\n'));
        }
    }
}
