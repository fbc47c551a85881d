//! `scan`: pages through a namespace with `SCAN`, node by node on a Cluster.
//!
//! A page walks `SCAN ... MATCH idem:{<namespace>:*` batches; each batch's records are read in
//! one pipeline of `get` scripts (so expiry is judged by the node's own clock) and filtered by
//! the query. A `SCAN` cursor is never sent twice: when a batch holds more matching records
//! than the page has room for, the Redis keys of the rest travel in the page's cursor and are
//! read first by the next page. So the guarantees are `SCAN`'s own: a record that exists for
//! the whole scan is returned; one created or removed meanwhile may or may not be; a record is
//! returned twice only if `SCAN` repeats its key (when the keyspace shrinks meanwhile).

use idem_core::{
    Record, ScanEntry, ScanPage, ScanQuery, State, StoreError, UnreadableRecord, duration_micros,
};

use crate::codec::decode_record;
use crate::conn::Node;
use crate::layout;
use crate::scripts::{GET_SOURCE, Reply, SCRIPTS};
use crate::store::RedisStore;

/// The `SCAN ... COUNT` hint: the page size, within these bounds.
const SCAN_COUNT: (usize, usize) = (16, 1000);

/// Where a scan stands: on which node, where its `SCAN` goes on (`None`: that node's `SCAN`
/// is done), and the keys of matching records a full page left over.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Cursor {
    node: Node,
    scan: Option<u64>,
    pending: Vec<String>,
}

impl Cursor {
    fn encode(&self) -> String {
        let (host, port) = self
            .node
            .as_ref()
            .map_or(("", 0), |(host, port)| (host.as_str(), *port));
        let scan = self.scan.map_or_else(|| "-".to_owned(), |c| c.to_string());
        format!("2|{host}|{port}|{scan}|{}", self.pending.join(","))
    }

    /// Decodes a cursor of `namespace`; every pending key must be one of its record keys.
    fn decode(text: &str, namespace: &str) -> Option<Cursor> {
        let mut parts = text.splitn(5, '|');
        if parts.next()? != "2" {
            return None;
        }
        let host = parts.next()?;
        let port: u16 = parts.next()?.parse().ok()?;
        let scan = match parts.next()? {
            "-" => None,
            number => Some(number.parse().ok()?),
        };
        let prefix = layout::scan_pattern(namespace);
        let prefix = prefix.strip_suffix('*')?;
        let pending: Vec<String> = parts
            .next()?
            .split(',')
            .filter(|k| !k.is_empty())
            .map(str::to_owned)
            .collect();
        if !pending
            .iter()
            .all(|k| k.starts_with(prefix) && k.ends_with('}'))
        {
            return None;
        }
        Some(Cursor {
            node: (!host.is_empty()).then(|| (host.to_owned(), port)),
            scan,
            pending,
        })
    }
}

pub(crate) async fn scan(store: &RedisStore, query: &ScanQuery) -> Result<ScanPage, StoreError> {
    let namespace = &store.inner.config.namespace;
    let start = match &query.cursor {
        Some(text) => {
            Some(Cursor::decode(text, namespace).ok_or_else(|| StoreError::invalid_cursor(text))?)
        }
        None => None,
    };
    let mut conn = store.inner.conn.clone();
    let nodes = store.bounded("scan", conn.scan_nodes()).await?;
    let limit = query.page_size();
    // Keys asked of each SCAN: the page size at first; doubled (up to the most) after a batch
    // in which fewer than an eighth matched, so a sparse filter (a few records in flight among
    // millions completed) takes few round trips, while the keys a full page leaves over, which
    // the cursor carries, stay about as few as a page (an eighth of 1,000).
    let mut count = limit.clamp(SCAN_COUNT.0, SCAN_COUNT.1);
    let pattern = layout::scan_pattern(namespace);
    let mut page = ScanPage::default();

    // Resume on the cursor's node, or from the start of the next one if it is gone.
    let first = start.as_ref().map_or(0, |cursor| {
        nodes
            .iter()
            .position(|node| *node >= cursor.node)
            .unwrap_or(nodes.len())
    });
    for (index, node) in nodes.iter().enumerate().skip(first) {
        let (mut scan_cursor, mut pending) = match &start {
            Some(cursor) if cursor.node == *node => (cursor.scan, cursor.pending.clone()),
            _ => (Some(0), Vec::new()),
        };
        loop {
            let keys = if pending.is_empty() {
                let Some(from) = scan_cursor else { break };
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(from)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(count);
                let reply = store.bounded("scan", conn.command_on(node, cmd)).await?;
                let (next, mut keys): (u64, Vec<String>) =
                    redis::from_redis_value(reply).map_err(|err| StoreError::Backend {
                        source: Box::new(err),
                        retryable: false,
                    })?;
                scan_cursor = (next != 0).then_some(next);
                keys.sort_unstable();
                keys.dedup();
                keys
            } else {
                std::mem::take(&mut pending)
            };
            let scanned = keys.len();
            let keys = candidates(store, &mut conn, node, keys, query).await?;
            let batch = read_records(store, &mut conn, node, &keys).await?;
            // A record that cannot be read is an entry too: reported, it takes its place on
            // the page, or travels in the cursor like a matching record.
            let mut entries = Vec::with_capacity(keys.len());
            for (key, read) in keys.into_iter().zip(batch) {
                let entry = match read {
                    Ok(Some((record, now))) => query.entry(None, Ok(Some(record)), now)?,
                    Ok(None) => None,
                    Err(err) => Some(ScanEntry::Unreadable(UnreadableRecord::from_error(
                        err, None,
                    )?)),
                };
                entries.extend(entry.map(|entry| (key, entry)));
            }
            let matched = entries.len();
            let mut entries = entries.into_iter();
            let room = limit - page.len();
            entries
                .by_ref()
                .take(room)
                .for_each(|(_, entry)| page.push(entry));
            let left: Vec<String> = entries.map(|(key, _)| key).collect();
            if matched.saturating_mul(8) < scanned {
                count = count.saturating_mul(2).min(SCAN_COUNT.1);
            }
            if page.len() == limit {
                let next = if !left.is_empty() || scan_cursor.is_some() {
                    Some(Cursor {
                        node: node.clone(),
                        scan: scan_cursor,
                        pending: left,
                    })
                } else {
                    nodes.get(index + 1).map(|node| Cursor {
                        node: node.clone(),
                        scan: Some(0),
                        pending: Vec::new(),
                    })
                };
                page.next_cursor = next.map(|c| c.encode());
                return Ok(page);
            }
        }
    }
    Ok(page)
}

/// The keys among `keys` that may hold a record `query`'s filters keep. With a state or age
/// filter, one pipeline reads the node's time and each key's meta field (an `HGET`, no script,
/// so a key left out costs a few dozen bytes instead of a script run and its whole record);
/// the keys whose meta says the record is gone (a tombstone, expired) or left out are dropped.
/// Every other key, a match or a value the meta cannot judge (not a hash, no meta, garbled), is
/// kept, in order, for [`read_records`], which reads and judges it as before.
async fn candidates(
    store: &RedisStore,
    conn: &mut crate::conn::Conn,
    node: &Node,
    keys: Vec<String>,
    query: &ScanQuery,
) -> Result<Vec<String>, StoreError> {
    if keys.is_empty() || (query.state.is_none() && query.min_age.is_none()) {
        return Ok(keys);
    }
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.cmd("TIME");
    for key in &keys {
        pipe.cmd("HGET").arg(key).arg("m");
    }
    let values = store
        .bounded("scan", conn.pipeline_on(node, pipe, keys.len() + 1))
        .await?;
    let (Some(time), Some(metas)) = (values.first(), values.get(1..)) else {
        return Ok(keys);
    };
    let Some(now) = server_time(time, store.offset_arg()) else {
        return Ok(keys);
    };
    if metas.len() != keys.len() {
        return Ok(keys);
    }
    let min_age = query.min_age.map_or(0, duration_micros);
    Ok(keys
        .into_iter()
        .zip(metas)
        .filter(|(_, meta)| !left_out(meta, now, query.state, min_age))
        .map(|(key, _)| key)
        .collect())
}

/// The reply of `TIME` as microseconds, plus the store's clock offset (tests move it).
fn server_time(reply: &redis::Value, offset: i64) -> Option<u64> {
    let (secs, micros): (u64, u64) = redis::from_redis_value_ref(reply).ok()?;
    let now = secs.checked_mul(1_000_000)?.checked_add(micros)?;
    now.checked_add_signed(offset)
}

/// Whether the meta field `value` shows a record `state` and `min_age` (microseconds) leave out,
/// or none at all (a tombstone, or expired at `now`). Anything this cannot read is not left
/// out: the record's read decides.
fn left_out(value: &redis::Value, now: u64, state: Option<State>, min_age: u64) -> bool {
    let redis::Value::BulkString(bytes) = value else {
        return false;
    };
    // A tombstone (a freed key's fence memory) is no record; one with fence 0 is garbled.
    if bytes.len() == crate::codec::META_BYTES && bytes.first() == Some(&b'-') {
        return bytes
            .get(6..13)
            .is_some_and(|fence| crate::codec::be56(fence) >= 1);
    }
    // The checks of the scripts' `unmeta` too (a fence of 0 is garbled): what they would call
    // corrupt must reach the read, which says so.
    let Ok(meta) = crate::codec::Meta::parse(bytes) else {
        return false;
    };
    if meta.fence < 1 {
        return false;
    }
    now >= meta.expires
        || state.is_some_and(|wanted| meta.state != wanted)
        || now.saturating_sub(meta.created) < min_age
}

/// Reads the records at `keys` on `node` in one pipeline: each with the node's time, `None`
/// where there is no live record, or the [`StoreError::Corrupt`] of one that cannot be read
/// (named by its Redis key). The outer error is the pipeline's.
async fn read_records(
    store: &RedisStore,
    conn: &mut crate::conn::Conn,
    node: &Node,
    keys: &[String],
) -> Result<Vec<RecordRead>, StoreError> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    pipe.cmd("SCRIPT").arg("LOAD").arg(GET_SOURCE);
    let offset = store.offset_arg();
    for key in keys {
        pipe.cmd("EVALSHA")
            .arg(SCRIPTS.get.hash())
            .arg(1)
            .arg(key)
            .arg(offset);
    }
    let values = store
        .bounded("scan", conn.pipeline_on(node, pipe, keys.len() + 1))
        .await?;
    let namespace = &store.inner.config.namespace;
    // The first answer is the SCRIPT LOAD's.
    let values = values.get(1..).unwrap_or_default();
    if values.len() != keys.len() {
        return Err(StoreError::Backend {
            source: format!(
                "a scan pipeline of {} reads answered {} values",
                keys.len(),
                values.len()
            )
            .into(),
            retryable: false,
        });
    }
    Ok(keys
        .iter()
        .zip(values)
        .map(|(key, value)| {
            let reply = Reply {
                op: "get",
                parts: redis::from_redis_value_ref::<Vec<Vec<u8>>>(value).map_err(|err| {
                    StoreError::Backend {
                        source: Box::new(err),
                        retryable: false,
                    }
                })?,
            };
            let corrupt = |reason: String| StoreError::Corrupt {
                key: key.clone(),
                reason,
            };
            match reply.tag() {
                b"record" => {
                    let now = idem_core::Timestamp::from_micros(reply.packed(1)?);
                    let fields = reply.parts.get(2..).ok_or_else(|| reply.unexpected())?;
                    let record = decode_record(None, fields, store.max_result()).map_err(
                        |err| match err {
                            StoreError::Corrupt { reason, .. } => corrupt(reason),
                            other => other,
                        },
                    )?;
                    if layout::redis_key(namespace, &record.key) != *key {
                        return Err(corrupt(
                            "the hash holds the record of another key".to_owned(),
                        ));
                    }
                    Ok(Some((record, now)))
                }
                b"none" => Ok(None),
                b"corrupt" => Err(corrupt(reply.text(1)?.to_owned())),
                _ => Err(reply.unexpected()),
            }
        })
        .collect())
}

/// What [`read_records`] read at one key.
type RecordRead = Result<Option<(Record, idem_core::Timestamp)>, StoreError>;

#[cfg(test)]
mod tests {
    use super::*;

    /// A meta field: state, codec '0', attempt 1, then fence, created, lease end, expires;
    /// `whole`, the owner and (settled) the completion time that follow.
    fn meta(state: u8, fence: u64, created: u64, expires: u64, whole: bool) -> redis::Value {
        let mut out = vec![state, b'0'];
        out.extend_from_slice(&1u32.to_be_bytes());
        for n in [fence, created, created + 1, expires] {
            out.extend_from_slice(&n.to_be_bytes()[1..]);
        }
        if whole {
            out.extend_from_slice(&[9; 16]);
            if state != b'i' {
                out.extend_from_slice(&(created + 1).to_be_bytes()[1..]);
            }
        }
        redis::Value::BulkString(out)
    }

    #[test]
    fn the_meta_leaves_out_only_what_the_read_would_leave_out() {
        let now = 1_000_000;
        let in_flight = meta(b'i', 3, 400_000, 2_000_000, true);
        let completed = meta(b'c', 3, 900_000, 2_000_000, true);
        let wanted = Some(State::InFlight);
        // The state filter, and the age filter (600,000 and 100,000 us old).
        assert!(!left_out(&in_flight, now, wanted, 0));
        assert!(left_out(&completed, now, wanted, 0));
        assert!(!left_out(&in_flight, now, None, 500_000));
        assert!(left_out(&completed, now, None, 500_000));
        // Gone: expired, or a tombstone.
        assert!(left_out(&meta(b'c', 3, 0, now, true), now, None, 1));
        assert!(left_out(
            &meta(b'-', 3, 0, 2_000_000, false),
            now,
            wanted,
            0
        ));
        // What the read must judge (and report as corrupt) is kept.
        for unreadable in [
            meta(b'-', 0, 0, 2_000_000, false),
            meta(b'i', 0, 400_000, 2_000_000, true),
            meta(b'i', 3, 400_000, 2_000_000, false),
            meta(b'c', 3, 400_000, 2_000_000, false),
            meta(b'x', 3, 400_000, 2_000_000, false),
            redis::Value::BulkString(b"garbage".to_vec()),
            redis::Value::Nil,
            redis::Value::Int(7),
        ] {
            assert!(
                !left_out(&unreadable, now, Some(State::Completed), 1),
                "{unreadable:?}"
            );
        }
    }

    #[test]
    fn the_server_time_takes_the_offset() {
        let reply = redis::Value::Array(vec![
            redis::Value::BulkString(b"1700000000".to_vec()),
            redis::Value::BulkString(b"250".to_vec()),
        ]);
        assert_eq!(server_time(&reply, 0), Some(1_700_000_000_000_250));
        assert_eq!(server_time(&reply, -250), Some(1_700_000_000_000_000));
        assert_eq!(server_time(&redis::Value::Nil, 0), None);
    }

    #[test]
    fn cursors_round_trip() {
        for cursor in [
            Cursor {
                node: None,
                scan: Some(0),
                pending: Vec::new(),
            },
            Cursor {
                node: Some(("::1".to_owned(), 7000)),
                scan: None,
                pending: vec!["idem:{n:a%7C:01}".to_owned(), "idem:{n::02}".to_owned()],
            },
            Cursor {
                node: None,
                scan: Some(1234),
                pending: vec!["idem:{n::03}".to_owned()],
            },
        ] {
            assert_eq!(Cursor::decode(&cursor.encode(), "n"), Some(cursor));
        }
        assert_eq!(Cursor::decode("garbage", "n"), None);
        assert_eq!(Cursor::decode("2|h|99999|0|", "n"), None);
        // A cursor cannot make the store read keys outside its namespace.
        assert_eq!(Cursor::decode("2||0|-|idem:{other::01}", "n"), None);
        assert_eq!(Cursor::decode("2||0|-|secret", "n"), None);
    }
}
