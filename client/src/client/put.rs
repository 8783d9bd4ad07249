//! Puts: `PUT_BEGIN` for a group of items, the client's own copy into local extents (hashed
//! chunk by chunk as it copies), the source of remote replicas (a registered buffer, inline
//! bytes, or a staging window), then `PUT_COMMIT`; retried with a fresh reservation only when
//! nothing can have been stored.

use regolith_proto::checksum;
use regolith_proto::uds::{pb, Op};

use super::*;
use crate::gather;

impl AsyncClient {
    pub async fn put(&self, key: &str, data: &[u8], cfg: &ReplicateConfig) -> Result<PutInfo> {
        self.put_from(key, Source::Bytes(data), cfg).await
    }

    pub async fn put_from(
        &self,
        key: &str,
        src: Source<'_>,
        cfg: &ReplicateConfig,
    ) -> Result<PutInfo> {
        self.batch_put_from(&[(key, src)], cfg)
            .await
            .pop()
            .unwrap_or_else(|| Err(Error::Protocol("no reply item".into())))
    }

    /// Puts many objects with one reserve and one commit round trip (per staging-sized group).
    pub async fn batch_put_from(
        &self,
        items: &[(&str, Source<'_>)],
        cfg: &ReplicateConfig,
    ) -> Vec<Result<PutInfo>> {
        let mut out: Vec<Option<Result<PutInfo>>> = (0..items.len()).map(|_| None).collect();
        let mut todo: Vec<usize> = (0..items.len()).collect();
        for n in 0..ATTEMPTS {
            if todo.is_empty() {
                break;
            }
            let s = match self.session().await {
                Ok(s) => s,
                Err(e) => {
                    for i in &todo {
                        out[*i] = Some(Err(e.clone()));
                    }
                    break;
                }
            };
            let mut retry = Vec::new();
            for group in groups(&todo, |i| items[i].1.len() as u64, s.stage.capacity()) {
                let res = self.put_group(&s, &group, items, cfg).await;
                for (i, (r, commit_sent)) in group.into_iter().zip(res) {
                    match r {
                        Err(e) if may_retry_put(&e, commit_sent) => {
                            out[i] = Some(Err(e));
                            retry.push(i);
                        }
                        r => out[i] = Some(r),
                    }
                }
            }
            todo = retry;
            if !todo.is_empty() && n + 1 < ATTEMPTS {
                tokio::time::sleep(retry_pause(n)).await;
            }
        }
        out.into_iter()
            .map(|o| o.unwrap_or_else(|| Err(Error::Protocol("put not attempted".into()))))
            .collect()
    }

    /// One reserve and one commit round trip for `group`; per item, the result and whether its
    /// commit was sent.
    async fn put_group(
        &self,
        s: &Session,
        group: &[usize],
        items: &[(&str, Source<'_>)],
        cfg: &ReplicateConfig,
    ) -> Vec<(Result<PutInfo>, bool)> {
        let options = cfg.options();
        let req = pb::PutBeginRequest {
            items: group
                .iter()
                .map(|&i| pb::PutBeginItem {
                    key: items[i].0.to_string(),
                    size: items[i].1.len() as u64,
                    options: Some(options.clone()),
                })
                .collect(),
        };
        let reply: pb::PutBeginReply = match s.conn.call(Op::PutBegin, &req).await {
            Ok(r) => r,
            Err(e) => return group.iter().map(|_| (Err(e.clone()), false)).collect(),
        };
        if reply.items.len() != group.len() {
            return group
                .iter()
                .map(|_| {
                    let e = Error::Protocol("put_begin answered the wrong number of items".into());
                    (Err(e), false)
                })
                .collect();
        }
        let mut results: Vec<Option<Result<PutInfo>>> = (0..group.len()).map(|_| None).collect();
        let mut commits = Vec::new();
        let mut committed_idx = Vec::new();
        let mut aborts = Vec::new();
        let mut windows = Vec::new();
        for (j, (&i, ticket)) in group.iter().zip(&reply.items).enumerate() {
            let (key, src) = (items[i].0, items[i].1);
            if let Some(e) = st_err(key, &ticket.status) {
                results[j] = Some(Err(e));
                continue;
            }
            match self.place_bytes(s, ticket, src).await {
                Ok((item, w)) => {
                    commits.push(item);
                    committed_idx.push(j);
                    windows.extend(w);
                }
                Err(e) => {
                    if let Some(v) = ticket.version {
                        aborts.push(v);
                    }
                    results[j] = Some(Err(e));
                }
            }
        }
        if !aborts.is_empty() {
            let _ = s
                .conn
                .call::<_, pb::Empty>(Op::PutAbort, &pb::PutAbortRequest { versions: aborts })
                .await;
        }
        if !commits.is_empty() {
            let reply: Result<pb::PutCommitReply> = s
                .conn
                .call(Op::PutCommit, &pb::PutCommitRequest { items: commits })
                .await;
            drop(windows);
            match reply {
                Ok(r) if r.items.len() == committed_idx.len() => {
                    for (j, res) in committed_idx.iter().zip(r.items) {
                        let key = items[group[*j]].0;
                        results[*j] = Some(match st_err(key, &res.status) {
                            Some(e) => Err(e),
                            None => Ok(PutInfo {
                                replicas: locations(&res.replicas),
                            }),
                        });
                    }
                }
                Ok(_) => {
                    for j in &committed_idx {
                        results[*j] = Some(Err(Error::Protocol(
                            "put_commit answered the wrong number of items".into(),
                        )));
                    }
                }
                Err(e) => {
                    for j in &committed_idx {
                        results[*j] = Some(Err(e.clone()));
                    }
                }
            }
        }
        results
            .into_iter()
            .enumerate()
            .map(|(j, r)| {
                let r = r.unwrap_or_else(|| Err(Error::Protocol("item not processed".into())));
                (r, committed_idx.contains(&j))
            })
            .collect()
    }

    /// Puts the bytes where the sidecar needs them: into the local extents (copy + checksum),
    /// or a source region for the sidecar to send to remote replicas.
    async fn place_bytes(
        &self,
        s: &Session,
        t: &pb::PutTicket,
        src: Source<'_>,
    ) -> Result<(pb::PutCommitItem, Option<Held>)> {
        let size = src.len();
        let seed = t.checksum_seed;
        let mut hashes = vec![0u64; checksum::chunk_count(size as u64)];
        let version = t.version;
        if !t.local_extents.is_empty() {
            let seg = s.segment.as_ref().ok_or_else(|| {
                Error::Protocol("local extents on a node without a segment".into())
            })?;
            match src {
                Source::Parts(parts) => {
                    copy_parts_to_extents(seg, &t.local_extents, parts, seed, &mut hashes)?
                }
                _ => with_source(&src, |bytes| {
                    copy_to_extents(seg, &t.local_extents, bytes, seed, &mut hashes)
                })??,
            }
            let item = pb::PutCommitItem {
                version,
                checksum: checksum::combine(seed, &hashes),
                checksum_known: true,
                source: None,
            };
            return Ok((item, None));
        }
        if !t.remote {
            return Err(Error::Protocol(
                "reservation with neither a local nor a remote replica".into(),
            ));
        }
        match src {
            Source::Shm { buf, offset, len } => {
                let shm_id = self.registered(s, buf).await?;
                let region = pb::Region {
                    r#where: Some(pb::region::Where::Shm(pb::ShmWindow {
                        shm_id,
                        offset: offset as u64,
                        len: len as u64,
                    })),
                };
                Ok((
                    pb::PutCommitItem {
                        version,
                        checksum: 0,
                        checksum_known: false,
                        source: Some(region),
                    },
                    None,
                ))
            }
            Source::Bytes(b) if b.len() <= INLINE_PUT => Ok(inline_item(version, seed, b.to_vec())),
            Source::Parts(parts) if size <= INLINE_PUT => {
                Ok(inline_item(version, seed, gather::join(parts)))
            }
            Source::Parts(parts) => {
                let held = self.lend(s, size as u64).await?;
                gather::for_each_chunk(parts, |i, chunk| {
                    held.write_hashed_at(s, i * checksum::CHUNK, chunk, seed, &mut hashes[i..=i])
                })?;
                Ok(staged_item(version, seed, &hashes, held, size))
            }
            Source::Bytes(b) => {
                let held = self.lend(s, b.len() as u64).await?;
                held.write_hashed(s, b, seed, &mut hashes)?;
                Ok(staged_item(version, seed, &hashes, held, size))
            }
        }
    }

    // ------------------------------------------------------------------ gets
}

/// A commit whose bytes travel inline in the frame, with their checksum.
fn inline_item(
    version: Option<pb::Version>,
    seed: u64,
    data: Vec<u8>,
) -> (pb::PutCommitItem, Option<Held>) {
    let item = pb::PutCommitItem {
        version,
        checksum: checksum::checksum(seed, &data),
        checksum_known: true,
        source: Some(pb::Region {
            r#where: Some(pb::region::Where::Inline(pb::Inline { data, max_len: 0 })),
        }),
    };
    (item, None)
}

/// A commit whose bytes wait in lent memory (staging or a temporary buffer), hashed.
fn staged_item(
    version: Option<pb::Version>,
    seed: u64,
    hashes: &[u64],
    held: Held,
    size: usize,
) -> (pb::PutCommitItem, Option<Held>) {
    let item = pb::PutCommitItem {
        version,
        checksum: checksum::combine(seed, hashes),
        checksum_known: true,
        source: Some(held.region(size as u64)),
    };
    (item, Some(held))
}

/// Runs `f` on the source bytes (a registered buffer is viewed in place; a gather list is
/// joined, which callers avoid by handling it first).
fn with_source<R>(src: &Source<'_>, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
    match src {
        Source::Bytes(b) => Ok(f(b)),
        Source::Parts(p) => Ok(f(&gather::join(p))),
        Source::Shm { buf, offset, len } => {
            // SAFETY: bounds-checked against the buffer's mapping; the view lives for `f` only.
            let b = unsafe { buf.inner.map.slice(*offset as u64, *len as u64)? };
            Ok(f(b))
        }
    }
}

/// Copies the object `src` into its extents of the segment, in object order, hashing chunks.
fn copy_to_extents(
    seg: &Mapping,
    extents: &[pb::Extent],
    src: &[u8],
    seed: u64,
    hashes: &mut [u64],
) -> Result<()> {
    let mut off = 0usize;
    for e in extents {
        if off >= src.len() {
            break;
        }
        let n = (e.len as usize).min(src.len() - off);
        let first_chunk = off / checksum::CHUNK;
        seg.write_hashed(
            e.offset,
            &src[off..off + n],
            seed,
            &mut hashes[first_chunk..],
        )?;
        off += n;
    }
    if off < src.len() {
        return Err(Error::Protocol(format!(
            "local extents hold {off} of {} bytes",
            src.len()
        )));
    }
    Ok(())
}

/// Copies the concatenation of `parts` into the object's extents of the segment, chunk by
/// chunk (all extents but the last are whole chunks, so no chunk straddles two).
fn copy_parts_to_extents(
    seg: &Mapping,
    extents: &[pb::Extent],
    parts: &[&[u8]],
    seed: u64,
    hashes: &mut [u64],
) -> Result<()> {
    let size = gather::total(parts);
    let (mut idx, mut start) = (0usize, 0usize);
    gather::for_each_chunk(parts, |i, chunk| {
        let off = i * checksum::CHUNK;
        while idx < extents.len() && off >= start + extents[idx].len as usize {
            start += extents[idx].len as usize;
            idx += 1;
        }
        let e = extents
            .get(idx)
            .filter(|e| off - start + chunk.len() <= e.len as usize);
        let Some(e) = e else {
            return Err(Error::Protocol(format!(
                "local extents do not hold bytes {off}..{} of {size}",
                off + chunk.len()
            )));
        };
        seg.write_hashed(
            e.offset + (off - start) as u64,
            chunk,
            seed,
            &mut hashes[i..=i],
        )
    })
}

/// Whether a failed put may be retried with a fresh reservation: only when nothing can have
/// been stored. Before its commit was sent, any retryable error; after, only a commit the
/// sidecar says was refused (UNAVAILABLE, BUSY). A TIMEOUT commit (metad's answer was lost) or a
/// connection lost after the commit was sent may have stored the value: a retry would answer
/// ALREADY_EXISTS for the caller's own value, so the caller gets the error instead.
fn may_retry_put(e: &Error, commit_sent: bool) -> bool {
    if commit_sent {
        matches!(
            e,
            Error::Server {
                code: pb::Code::Unavailable | pb::Code::Busy,
                ..
            }
        )
    } else {
        e.is_retryable() || matches!(e, Error::Disconnected(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_put_is_retried_only_when_nothing_can_have_been_stored() {
        let server = |code| Error::Server {
            key: "k".into(),
            code,
            message: String::new(),
        };
        let lost = || Error::Disconnected("eof".into());
        // Before the commit was sent: every transient failure.
        assert!(may_retry_put(&server(pb::Code::Unavailable), false));
        assert!(may_retry_put(&server(pb::Code::Timeout), false));
        assert!(may_retry_put(&lost(), false));
        // After: only a refused commit.
        assert!(may_retry_put(&server(pb::Code::Unavailable), true));
        assert!(!may_retry_put(&server(pb::Code::Timeout), true));
        assert!(!may_retry_put(&lost(), true));
        assert!(!may_retry_put(&server(pb::Code::Internal), true));
    }
}
