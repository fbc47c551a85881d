//! `scan`: pages through a namespace with `SCAN`, node by node on a Cluster.
//!
//! A page walks `SCAN ... MATCH idem:{<namespace>:*` batches; each batch's records are read in
//! one pipeline of `get` scripts (so expiry is judged by the node's own clock) and filtered by
//! the query. A `SCAN` cursor is never sent twice: when a batch holds more matching records
//! than the page has room for, the Redis keys of the rest travel in the page's cursor and are
//! read first by the next page. So the guarantees are `SCAN`'s own: a record that exists for
//! the whole scan is returned; one created or removed meanwhile may or may not be; a record is
//! returned twice only if `SCAN` repeats its key (when the keyspace shrinks meanwhile).

use idem_core::{Record, ScanPage, ScanQuery, StoreError};

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
        Some(text) => Some(
            Cursor::decode(text, namespace).ok_or_else(|| StoreError::Backend {
                source: format!("not a scan cursor of this store: {text:?}").into(),
                retryable: false,
            })?,
        ),
        None => None,
    };
    let mut conn = store.inner.conn.clone();
    let nodes = store.bounded("scan", conn.scan_nodes()).await?;
    let limit = query.page_size();
    let count = limit.clamp(SCAN_COUNT.0, SCAN_COUNT.1);
    let pattern = layout::scan_pattern(namespace);
    let mut records: Vec<Record> = Vec::with_capacity(limit);

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
            let batch = read_records(store, &mut conn, node, &keys).await?;
            let mut matching = keys.into_iter().zip(batch).filter_map(|(key, found)| {
                found.and_then(|(record, now)| query.matches(&record, now).then_some((key, record)))
            });
            let room = limit - records.len();
            records.extend(matching.by_ref().take(room).map(|(_, record)| record));
            let left: Vec<String> = matching.map(|(key, _)| key).collect();
            if records.len() == limit {
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
                return Ok(ScanPage {
                    records,
                    next_cursor: next.map(|c| c.encode()),
                });
            }
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
