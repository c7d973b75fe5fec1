//! Metadata URLs: which engine a volume's metadata lives in, as JuiceFS
//! spells it (`sqlite3://PATH`, `redis://HOST:PORT/DB`, ...).

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::meta::Meta;
use crate::meta::redis::RedisMeta;
use crate::meta::sqlite::{SqliteMeta, SqliteOptions, Synchronous};
use crate::redact::redact_url;

/// A metadata URL as the user gave it, password included. `Display` and
/// `Debug` show it through [`redact_url`], so that formatting one into a
/// message or dumping a command line's arguments never prints the
/// password; [`MetaUrl::expose`] is the one way to the whole text, for
/// opening the engine.
#[derive(Clone, PartialEq, Eq)]
pub struct MetaUrl(String);

impl MetaUrl {
    /// Wraps a URL.
    pub fn new(url: impl Into<String>) -> MetaUrl {
        MetaUrl(url.into())
    }

    /// The URL with its secrets, for the one place that connects.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL without its secrets (what `Display` shows).
    pub fn redacted(&self) -> String {
        redact_url(&self.0)
    }
}

impl From<String> for MetaUrl {
    fn from(url: String) -> MetaUrl {
        MetaUrl(url)
    }
}

impl std::fmt::Display for MetaUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl std::fmt::Debug for MetaUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MetaUrl({:?})", self.redacted())
    }
}

/// Opens the metadata engine a URL names: `sqlite3://PATH`
/// (`sqlite3:///abs/path.db` or `sqlite3://relative.db`), or a Redis server:
/// `redis://[[user]:pass@]host[:port][/db]`, `rediss://…` (TLS),
/// `unix:///socket?db=N` (see [`RedisMeta::open`]). Of JuiceFS's
/// driver options after `?`, `_sync`/`_synchronous` (`normal` or `full`) and
/// `_timeout`/`_busy_timeout` (milliseconds) are honoured, others ignored.
pub fn open_meta(url: &str) -> Result<Arc<dyn Meta>> {
    let shown = redact_url(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(Error::Invalid(format!(
            "metadata URL {shown:?} has no scheme; use sqlite3://PATH"
        )));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "sqlite3" | "sqlite" => {
            let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
            if path.is_empty() {
                return Err(Error::Invalid(format!(
                    "metadata URL {shown:?} names no database file; use sqlite3://PATH"
                )));
            }
            Ok(Arc::new(SqliteMeta::open_with(
                path,
                sqlite_options(query)?,
            )?))
        }
        "redis" | "rediss" | "unix" => Ok(Arc::new(RedisMeta::open(url)?)),
        "mysql" | "postgres" | "tikv" | "etcd" | "badger" | "fdb" | "memkv" => {
            Err(Error::NotSupported(format!(
                "the {scheme} metadata engine is not supported; use sqlite3://PATH"
            )))
        }
        _ => Err(Error::Invalid(format!(
            "unknown metadata engine {scheme:?} in {shown:?}; use sqlite3://PATH"
        ))),
    }
}

/// Opens the metadata engine of a volume that exists, as [`open_meta`]
/// does, but never creates a SQLite database: a URL whose path holds none
/// (a mistyped one) is refused with a message naming the path, and leaves
/// nothing behind. Only `format` and `load` create databases.
pub fn open_existing_meta(url: &str) -> Result<Arc<dyn Meta>> {
    if let Some(path) = sqlite_path(url)
        && std::fs::symlink_metadata(path).is_err()
    {
        return Err(Error::Invalid(format!(
            "there is no SQLite database at {path}: check the metadata URL \
             (`sluice format` creates the database of a new volume)"
        )));
    }
    open_meta(url)
}

/// The database path of a `sqlite3://` URL; `None` for other engines.
fn sqlite_path(url: &str) -> Option<&str> {
    let (scheme, rest) = url.split_once("://")?;
    if !matches!(scheme.to_ascii_lowercase().as_str(), "sqlite3" | "sqlite") {
        return None;
    }
    let path = rest.split_once('?').map_or(rest, |(p, _)| p);
    (!path.is_empty()).then_some(path)
}

/// Reads the SQLite driver options JuiceFS URLs may carry.
fn sqlite_options(query: &str) -> Result<SqliteOptions> {
    let mut opts = SqliteOptions::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "_sync" | "_synchronous" => {
                opts.synchronous = match value.to_ascii_lowercase().as_str() {
                    "normal" | "1" => Synchronous::Normal,
                    "full" | "2" | "extra" | "3" => Synchronous::Full,
                    _ => {
                        return Err(Error::Invalid(format!(
                            "{key}={value} is not a synchronous mode; use normal or full"
                        )));
                    }
                }
            }
            "_timeout" | "_busy_timeout" => {
                let ms: u64 = value.parse().map_err(|_| {
                    Error::Invalid(format!("{key}={value} is not a number of milliseconds"))
                })?;
                opts.busy_timeout = std::time::Duration::from_millis(ms);
            }
            _ => log::debug!("ignoring SQLite URL option {key}"),
        }
    }
    Ok(opts)
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
    fn a_missing_database_is_refused_and_never_created() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("missing.db");
        let url = format!("sqlite3://{}?_sync=full", path.display());
        let err = open_existing_meta(&url).unwrap_err().to_string();
        assert!(
            err.contains(&format!("no SQLite database at {}", path.display())),
            "{err}"
        );
        assert!(!path.exists(), "an empty database was left behind");
        open_meta(&url).expect("format creates it");
        open_existing_meta(&url).expect("then it opens");
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
    fn sqlite_options_follow_juicefs_names() {
        let o = sqlite_options("cache=shared&_sync=full&_timeout=100").expect("options");
        assert_eq!(o.synchronous, Synchronous::Full);
        assert_eq!(o.busy_timeout, std::time::Duration::from_millis(100));
        assert_eq!(sqlite_options("").expect("none"), SqliteOptions::default());
        assert!(sqlite_options("_sync=sometimes").is_err());
        assert!(sqlite_options("_timeout=soon").is_err());
    }

    #[test]
    fn other_urls_get_one_clear_line() {
        assert!(err("rediss://127.0.0.1:1/1").contains("cannot reach Redis"));
        assert!(err("rediss://127.0.0.1:1/1?insecure-skip-verify=maybe").contains("true or false"));
        assert!(err("redis://127.0.0.1:1/1").contains("cannot reach Redis"));
        // A Sentinel URL whose sentinels do not answer.
        assert!(
            err("redis://:pw@mymaster,127.0.0.1:1,127.0.0.1:2/2").contains("cannot reach Redis")
        );
        assert!(err("redis://mymaster,127.0.0.1:notaport/2").contains("HOST[:PORT]"));
        assert!(err("redis://,127.0.0.1:1/2").contains("names the master first"));
        assert!(err("redis://127.0.0.1:1/2?fsync-replicas=two").contains("number of replicas"));
        assert!(err("mysql://u:p@(h:3306)/db").contains("not supported"));
        assert!(err("/tmp/x.db").contains("no scheme"));
        assert!(err("ftp://x").contains("unknown metadata engine"));
        assert!(err("sqlite3://").contains("names no database"));
        assert!(err("sqlite3:///nonexistent-dir-xyz/a.db").contains("does not exist"));
        for url in ["redis://127.0.0.1:1/1", "/tmp/x.db", "ftp://x"] {
            assert!(!err(url).contains('\n'));
        }
    }

    #[test]
    fn no_error_shows_a_password() {
        for url in [
            "redis://:s3cret@127.0.0.1:1/1",
            "redis://user:s3cret@127.0.0.1:1/1",
            "redis://:p@s3cret@127.0.0.1:1/1",
            "redis://user:s3cret/x@127.0.0.1:1/1",
            "rediss://:s3cret@127.0.0.1:1/1?insecure-skip-verify=maybe",
            "redis://:s3cret@mymaster,h1,h2:26379/2",
            "redis://:s3cret@127.0.0.1:1/notadb",
            "unix:///nonexistent/redis.sock?db=1&pass=s3cret",
            "mysql://u:s3cret@(h:3306)/db",
            "ftp://u:s3cret@x",
        ] {
            let e = err(url);
            assert!(!e.contains("s3cret"), "{url}: {e}");
        }
    }

    #[test]
    fn a_meta_url_formats_without_its_password() {
        let url = MetaUrl::from("redis://user:s3cret@host:6379/1".to_string());
        assert_eq!(url.to_string(), "redis://user@host:6379/1");
        assert!(!format!("{url:?}").contains("s3cret"));
        assert!(!format!("{url:#?}").contains("s3cret"));
        assert_eq!(url.expose(), "redis://user:s3cret@host:6379/1");
        let sqlite = MetaUrl::new("sqlite3:///tmp/vol.db");
        assert_eq!(sqlite.to_string(), "sqlite3:///tmp/vol.db");
    }
}
