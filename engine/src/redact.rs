//! Secrets out of URLs: the one place that decides what of a metadata URL
//! or a bucket URL may be shown — in an error, a log line, the source
//! column of `/proc/mounts`, a status report or a `Debug` dump.
//!
//! A URL loses its password (`redis://user:PASSWORD@host/1` becomes
//! `redis://user@host/1`) and the query parameters that carry secrets
//! (`unix:///run/redis.sock?db=1&pass=PASSWORD` becomes
//! `unix:///run/redis.sock?db=1`). Everything else stays byte for byte, so
//! the result still names the same volume and opens it again when the
//! password comes from `REDIS_PASSWORD`/`META_PASSWORD`: that is how
//! `sluice info PATH` reopens a mount's volume from `/proc/mounts`. The
//! password is removed rather than masked because a mask (`****`) would be
//! a wrong password to whoever reuses the URL.
//!
//! Which part is the password is decided by parsing, not by looking for the
//! first `@`:
//!
//! - Schemes whose "authority" is a file path (`sqlite3://`, `unix://`,
//!   `file://`) have no user information: a path such as
//!   `sqlite3:///srv/a@b/vol.db` is kept whole.
//! - Otherwise the user information ends at the *last* `@`, as URL parsers
//!   (and the Redis driver) read it, so a password may hold `@`, `:` or
//!   percent-escapes. A password with a raw `/`, `?` or `#` makes the URL
//!   ambiguous: a parser ends the host there and the Redis driver would read
//!   a different URL. When the [`url`] parser sees such a split (an `@`
//!   after the host) everything up to the last `@` goes, the user name too.
//!   An `@` in a query value (a TLS file path) is therefore shown cut; the
//!   safe side of the ambiguity.

use std::borrow::Cow;

/// Query parameters whose values are secrets (compared without case).
const SECRET_PARAMS: [&str; 10] = [
    "pass",
    "password",
    "passwd",
    "secret",
    "secret-key",
    "secret_key",
    "secretkey",
    "token",
    "session-token",
    "session_token",
];

/// Schemes whose text after `://` is a path, never `user:pass@host`.
const PATH_SCHEMES: [&str; 6] = ["sqlite3", "sqlite", "file", "unix", "redis+unix", "badger"];

/// `url` without its password and without query parameters that carry
/// secrets; a string that is not a URL (no `scheme://`) is returned as it
/// is. See the module documentation for the rules.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let valid_scheme = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !valid_scheme {
        return url.to_owned();
    }
    let rest: Cow<'_, str> = if PATH_SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()) {
        Cow::Borrowed(rest)
    } else {
        without_user_info(url, rest)
    };
    let (base, query) = match rest.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (rest.as_ref(), None),
    };
    let mut out = format!("{scheme}://{base}");
    if let Some(query) = query {
        let (query, fragment) = match query.split_once('#') {
            Some((q, f)) => (q, Some(f)),
            None => (query, None),
        };
        let kept: Vec<&str> = query
            .split('&')
            .filter(|pair| {
                let key = pair.split_once('=').map_or(*pair, |(k, _)| k);
                !SECRET_PARAMS
                    .iter()
                    .any(|s| s.eq_ignore_ascii_case(key.trim()))
            })
            .collect();
        if !kept.is_empty() {
            out.push('?');
            out.push_str(&kept.join("&"));
        }
        if let Some(fragment) = fragment {
            out.push('#');
            out.push_str(fragment);
        }
    }
    out
}

/// `rest` (the text after `scheme://` of `url`) with the password removed
/// from its user information; the user name stays when the URL is
/// unambiguous.
fn without_user_info<'a>(url: &str, rest: &'a str) -> Cow<'a, str> {
    let Some(at) = rest.rfind('@') else {
        return Cow::Borrowed(rest);
    };
    let (user_info, host_on) = (&rest[..at], &rest[at + 1..]);
    let unambiguous = url::Url::parse(url).is_ok_and(|u| {
        !u.path().contains('@')
            && !u.query().is_some_and(|q| q.contains('@'))
            && !u.fragment().is_some_and(|f| f.contains('@'))
    });
    let user = match user_info.split_once(':') {
        Some((user, _)) => user,
        None => user_info,
    };
    if unambiguous && !user.is_empty() {
        Cow::Owned(format!("{user}@{host_on}"))
    } else {
        Cow::Borrowed(host_on)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_leave_urls_of_every_shape() {
        let cases = [
            // (input, shown)
            ("redis://:s3cret@host:6379/1", "redis://host:6379/1"),
            (
                "redis://user:s3cret@host:6379/1",
                "redis://user@host:6379/1",
            ),
            ("rediss://user:s3cret@host/2", "rediss://user@host/2"),
            ("REDIS://:s3cret@host/1", "REDIS://host/1"),
            // '@' and ':' in the password: the last '@' ends it.
            ("redis://:p@ss@host/1", "redis://host/1"),
            ("redis://u:p@s:s@w@rd@host:6379/3", "redis://u@host:6379/3"),
            ("redis://u:a:b:c@host/1", "redis://u@host/1"),
            // Percent-escapes stay escapes of the password: all gone.
            ("redis://:p%40ss%2Fw@host/1", "redis://host/1"),
            // A raw '/', '?' or '#' in the password: ambiguous, user gone too.
            ("redis://user:123/ss@host/1", "redis://host/1"),
            ("redis://user:pa/ss@host/1", "redis://host/1"),
            ("redis://user:12?ss@host/1", "redis://host/1"),
            ("redis://user:pa#ss@host/1", "redis://host/1"),
            ("redis://:pa/ss@host/1", "redis://host/1"),
            // A user without a password is not a secret.
            ("redis://user@host/1", "redis://user@host/1"),
            ("redis://user:@host/1", "redis://user@host/1"),
            // IPv6 hosts.
            ("redis://:s3cret@[::1]:6379/0", "redis://[::1]:6379/0"),
            (
                "redis://:s3cret@[fe80::1%25eth0]:6379/0",
                "redis://[fe80::1%25eth0]:6379/0",
            ),
            ("redis://[::1]:6379/0", "redis://[::1]:6379/0"),
            // Several hosts (Sentinel).
            ("redis://:s3cret@h1,h2:26379/2", "redis://h1,h2:26379/2"),
            // Options stay; secret options go.
            (
                "rediss://:s3cret@host/1?tls-ca-cert-file=/etc/ca.pem&insecure-skip-verify=true",
                "rediss://host/1?tls-ca-cert-file=/etc/ca.pem&insecure-skip-verify=true",
            ),
            (
                "unix:///run/redis.sock?db=1&pass=s3cret",
                "unix:///run/redis.sock?db=1",
            ),
            (
                "unix:///run/redis.sock?PASSWORD=s3cret&db=1",
                "unix:///run/redis.sock?db=1",
            ),
            ("redis://host/1?password=s3cret", "redis://host/1"),
            ("redis://host/1?token=s3cret#frag", "redis://host/1#frag"),
            // S3 bucket URLs with keys in them.
            (
                "http://AKID:s3cret@127.0.0.1:9000/bucket",
                "http://AKID@127.0.0.1:9000/bucket",
            ),
            (
                "https://AKID:s3cret@bucket.s3.us-east-1.amazonaws.com",
                "https://AKID@bucket.s3.us-east-1.amazonaws.com",
            ),
            // Other engines JuiceFS knows.
            (
                "mysql://jfs:s3cret@(127.0.0.1:3306)/juicefs",
                "mysql://(127.0.0.1:3306)/juicefs",
            ),
            (
                "postgres://jfs:s3cret@host:5432/db?sslmode=disable",
                "postgres://jfs@host:5432/db?sslmode=disable",
            ),
        ];
        for (input, shown) in cases {
            let out = redact_url(input);
            assert_eq!(out, shown, "{input}");
            assert!(!out.contains("s3cret"), "{input} -> {out}");
            assert!(
                !out.contains("ss@") && !out.contains("p@"),
                "{input} -> {out}"
            );
        }
    }

    #[test]
    fn paths_are_kept_whole() {
        for url in [
            "sqlite3:///var/lib/sluice/vol.db",
            "sqlite3:///srv/a@b/vol.db",
            "sqlite3://relative@dir/vol.db",
            "sqlite3:///tmp/x.db?_sync=full&_timeout=100",
            "SQLITE3:///tmp/x.db",
            "unix:///run/my@redis.sock?db=2",
            "file:///srv/bucket@1/",
            "/srv/sluice/objects",
            "relative/with@at",
            "user:pass@host/bucket",
            "",
        ] {
            assert_eq!(redact_url(url), url);
        }
        // A secret option is still a secret in a path URL.
        assert_eq!(
            redact_url("sqlite3:///tmp/x.db?password=s3cret"),
            "sqlite3:///tmp/x.db"
        );
    }

    #[test]
    fn shown_urls_open_the_same_redis_server() {
        // The source column of /proc/mounts is reopened by `sluice info
        // PATH`: what is left must still be a URL the driver reads the same.
        use redis::IntoConnectionInfo;
        for (input, db) in [
            ("redis://user:s3cret@127.0.0.1:6390/3", 3),
            ("redis://:p@ss@127.0.0.1:6390/4", 4),
            ("redis://:s3cret@[::1]:6390/5", 5),
        ] {
            let shown = redact_url(input);
            let info = shown.as_str().into_connection_info().expect(&shown);
            assert_eq!(info.redis_settings().db(), db, "{shown}");
            assert_eq!(info.redis_settings().password(), None, "{shown}");
        }
    }
}
