//! Finding the Redis Cluster node that holds a volume's slot.

use redis::{ConnectionLike, RedisResult, Value};

/// The (host, port) of the master serving the slot of `key`; the host is
/// empty when the node announces none (it is the one asked).
pub(super) fn slot_master(
    c: &mut dyn ConnectionLike,
    key: &str,
) -> RedisResult<Option<(String, u16)>> {
    let slot: i64 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query(c)?;
    let ranges: Vec<Value> = redis::cmd("CLUSTER").arg("SLOTS").query(c)?;
    for range in ranges {
        let Value::Array(parts) = range else { continue };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            continue;
        };
        if !(*start..=*end).contains(&slot) {
            continue;
        }
        let host = match master.first() {
            Some(Value::BulkString(h)) => String::from_utf8_lossy(h).into_owned(),
            Some(Value::SimpleString(h)) => h.clone(),
            _ => String::new(),
        };
        let host = if host == "?" { String::new() } else { host };
        if let Some(Value::Int(port)) = master.get(1) {
            return Ok(u16::try_from(*port).ok().map(|p| (host, p)));
        }
    }
    Ok(None)
}
