//! `scan`: pages through a namespace with `SCAN`, node by node on a Cluster.
//!
//! A page walks `SCAN ... MATCH idem:{<namespace>:*` batches; each batch's records are read in
//! one pipeline of `GET`s and judged by the query at the store's time. A `SCAN` cursor is never sent twice: when a batch holds more matching records
//! than the page has room for, the Redis keys of the rest travel in the page's cursor and are
//! read first by the next page. So the guarantees are `SCAN`'s own: a record that exists for
//! the whole scan is returned; one created or removed meanwhile may or may not be; a record is
//! returned twice only if `SCAN` repeats its key (when the keyspace shrinks meanwhile).

use idem_core::atomic::Slot;
use idem_core::{Record, ScanEntry, ScanPage, ScanQuery, StoreError, Timestamp, UnreadableRecord};

use crate::codec::decode_value;
use crate::conn::Node;
use crate::layout;
use crate::primitives::Backend;

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

pub(crate) async fn scan(
    store: &Backend,
    query: &ScanQuery,
    now: Timestamp,
) -> Result<ScanPage, StoreError> {
    let namespace = &store.config.namespace;
    let start = match &query.cursor {
        Some(text) => {
            Some(Cursor::decode(text, namespace).ok_or_else(|| StoreError::invalid_cursor(text))?)
        }
        None => None,
    };
    let mut conn = store.conn.clone();
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
                let (next, keys) = scan_keys(store, &mut conn, node, from, &pattern, count).await?;
                scan_cursor = next;
                keys
            } else {
                std::mem::take(&mut pending)
            };
            let scanned = keys.len();
            let entries = entries(store, &mut conn, node, keys, query, now).await?;
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

/// One `SCAN` of `node` from the cursor `from`: the next cursor (`None` once the node is
/// done) and the keys found, sorted and without duplicates.
async fn scan_keys(
    store: &Backend,
    conn: &mut crate::conn::Conn,
    node: &Node,
    from: u64,
    pattern: &str,
    count: usize,
) -> Result<(Option<u64>, Vec<String>), StoreError> {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(from)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(count);
    let reply = store.bounded("scan", conn.command_on(node, cmd)).await?;
    let (next, mut keys): (u64, Vec<String>) =
        redis::from_redis_value(reply).map_err(|err| StoreError::Backend {
            source: Box::new(err),
            retryable: false,
        })?;
    keys.sort_unstable();
    keys.dedup();
    Ok(((next != 0).then_some(next), keys))
}

/// The entries of the records at `keys` on `node` that `query` asks for, each with its key.
/// A record that cannot be read is an entry too: reported, it takes its place on the page, or
/// travels in the cursor like a matching record.
async fn entries(
    store: &Backend,
    conn: &mut crate::conn::Conn,
    node: &Node,
    keys: Vec<String>,
    query: &ScanQuery,
    now: Timestamp,
) -> Result<Vec<(String, ScanEntry)>, StoreError> {
    let batch = read_records(store, conn, node, &keys).await?;
    let mut entries = Vec::with_capacity(keys.len());
    for (key, read) in keys.into_iter().zip(batch) {
        let entry = match read {
            Ok(Some(record)) => query.entry(None, Ok(Some(record)), now)?,
            Ok(None) => None,
            Err(err) => Some(ScanEntry::Unreadable(UnreadableRecord::from_error(
                err, None,
            )?)),
        };
        entries.extend(entry.map(|entry| (key, entry)));
    }
    Ok(entries)
}

/// Reads the values at `keys` on `node` in one pipeline of `GET`s: each record (`None` where
/// there is none, or a tombstone), or the [`StoreError::Corrupt`] of one that cannot be read
/// (named by its Redis key). The outer error is the pipeline's.
async fn read_records(
    backend: &Backend,
    conn: &mut crate::conn::Conn,
    node: &Node,
    keys: &[String],
) -> Result<Vec<RecordRead>, StoreError> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for key in keys {
        pipe.cmd("GET").arg(key);
    }
    let values = backend
        .bounded("scan", conn.pipeline_on(node, pipe, keys.len()))
        .await?;
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
    let namespace = &backend.config.namespace;
    Ok(keys
        .iter()
        .zip(values)
        .map(|(key, value)| {
            let corrupt = |reason: &str| StoreError::Corrupt {
                key: key.clone(),
                reason: reason.to_owned(),
            };
            let raw = match value {
                redis::Value::Nil => return Ok(None),
                redis::Value::BulkString(raw) => raw,
                _ => return Err(corrupt("the key holds no record value")),
            };
            match decode_value(&|| key.clone(), None, &raw, backend.max_result())? {
                Slot::Tombstone(_) => Ok(None),
                Slot::Record(record) if layout::redis_key(namespace, &record.key) == *key => {
                    Ok(Some(record))
                }
                Slot::Record(_) => Err(corrupt("the value holds the record of another key")),
            }
        })
        .collect())
}

/// What [`read_records`] read at one key.
type RecordRead = Result<Option<Record>, StoreError>;

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
