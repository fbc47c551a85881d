//! `scan`: pages through a namespace with `SCAN`, node by node on a Cluster.
//!
//! A page walks `SCAN ... MATCH idem:{<namespace>:*` batches; each batch's records are read in
//! one pipeline of `get` scripts (so expiry is judged by the node's own clock), filtered by the
//! query, and returned up to the page size. The cursor names the node, the `SCAN` cursor of the
//! batch, and the last Redis key returned from that batch (batches are sorted by key), so a page
//! that stops in the middle of a batch resumes right after its last record.
//!
//! The guarantees are `SCAN`'s: a record that exists for the whole scan is returned; one that
//! is created or removed meanwhile may or may not be, and a keyspace that shrinks while you page
//! may return a record twice.

use idem_core::{Record, ScanPage, ScanQuery, StoreError};

use crate::codec::decode_record;
use crate::conn::Node;
use crate::layout;
use crate::scripts::{GET_SOURCE, Reply, SCRIPTS};
use crate::store::RedisStore;

/// How many keys one `SCAN` call looks at (a hint to Redis).
const SCAN_COUNT: usize = 256;

/// Where a scan stands.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Cursor {
    node: Node,
    scan: u64,
    after: Option<String>,
}

impl Cursor {
    fn encode(&self) -> String {
        let (host, port) = self
            .node
            .as_ref()
            .map_or(("", 0), |(host, port)| (host.as_str(), *port));
        format!(
            "1|{host}|{port}|{}|{}",
            self.scan,
            self.after.as_deref().unwrap_or("")
        )
    }

    fn decode(text: &str) -> Option<Cursor> {
        let mut parts = text.splitn(5, '|');
        if parts.next()? != "1" {
            return None;
        }
        let host = parts.next()?;
        let port: u16 = parts.next()?.parse().ok()?;
        let scan = parts.next()?.parse().ok()?;
        let after = parts.next()?;
        Some(Cursor {
            node: (!host.is_empty()).then(|| (host.to_owned(), port)),
            scan,
            after: (!after.is_empty()).then(|| after.to_owned()),
        })
    }
}

pub(crate) async fn scan(store: &RedisStore, query: &ScanQuery) -> Result<ScanPage, StoreError> {
    let start = match &query.cursor {
        Some(text) => Some(Cursor::decode(text).ok_or_else(|| StoreError::Backend {
            source: format!("not a cursor of this store: {text:?}").into(),
            retryable: false,
        })?),
        None => None,
    };
    let mut conn = store.inner.conn.clone();
    let nodes = store.bounded("scan", conn.scan_nodes()).await?;
    let limit = query.page_size();
    let pattern = layout::scan_pattern(&store.inner.config.namespace);
    let mut records: Vec<Record> = Vec::new();

    // Resume on the cursor's node, or the next one after it if it is gone.
    let first = match &start {
        Some(cursor) => nodes
            .iter()
            .position(|node| *node >= cursor.node)
            .unwrap_or(nodes.len()),
        None => 0,
    };
    for (index, node) in nodes.iter().enumerate().skip(first) {
        let (mut scan_cursor, mut after) = match &start {
            Some(cursor) if cursor.node == *node => (cursor.scan, cursor.after.clone()),
            _ => (0, None),
        };
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(scan_cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let reply = store.bounded("scan", conn.command_on(node, cmd)).await?;
            let (next, mut keys): (u64, Vec<String>) =
                redis::from_redis_value(reply).map_err(|err| StoreError::Backend {
                    source: Box::new(err),
                    retryable: false,
                })?;
            keys.sort_unstable();
            keys.dedup();
            if let Some(after) = &after {
                keys.retain(|k| k > after);
            }
            let batch = read_records(store, &mut conn, node, &keys).await?;
            for (position, (key, record)) in keys.iter().zip(batch).enumerate() {
                let Some(record) = record else { continue };
                if !query.matches(&record.0, record.1) {
                    continue;
                }
                records.push(record.0);
                if records.len() == limit {
                    let next_cursor = if position + 1 < keys.len() {
                        Some(Cursor {
                            node: node.clone(),
                            scan: scan_cursor,
                            after: Some(key.clone()),
                        })
                    } else if next != 0 {
                        Some(Cursor {
                            node: node.clone(),
                            scan: next,
                            after: None,
                        })
                    } else {
                        nodes.get(index + 1).map(|node| Cursor {
                            node: node.clone(),
                            scan: 0,
                            after: None,
                        })
                    };
                    return Ok(ScanPage {
                        records,
                        next_cursor: next_cursor.map(|c| c.encode()),
                    });
                }
            }
            if next == 0 {
                break;
            }
            scan_cursor = next;
            after = None;
        }
    }
    Ok(ScanPage {
        records,
        next_cursor: None,
    })
}

/// Reads the records at `keys` on `node` in one pipeline: each with the node's time, or
/// `None` where there is no live record.
async fn read_records(
    store: &RedisStore,
    conn: &mut crate::conn::Conn,
    node: &Node,
    keys: &[String],
) -> Result<Vec<Option<(Record, idem_core::Timestamp)>>, StoreError> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    pipe.cmd("SCRIPT").arg("LOAD").arg(GET_SOURCE);
    let offset = store.offset_arg();
    for key in keys {
        pipe.cmd("EVALSHA")
            .arg(SCRIPTS.get.get_hash())
            .arg(1)
            .arg(key)
            .arg(&offset);
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
    keys.iter()
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
                    let now = idem_core::Timestamp::from_micros(reply.number(1)?);
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
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip() {
        for cursor in [
            Cursor {
                node: None,
                scan: 0,
                after: None,
            },
            Cursor {
                node: Some(("::1".to_owned(), 7000)),
                scan: 1234,
                after: Some("idem:{n:a%7C:0123}".to_owned()),
            },
        ] {
            assert_eq!(Cursor::decode(&cursor.encode()), Some(cursor));
        }
        assert_eq!(Cursor::decode("garbage"), None);
        assert_eq!(Cursor::decode("1|h|99999|0|"), None);
    }
}
