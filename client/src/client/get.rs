//! Gets: local extents copied out of the mapped segment and verified by the client, or bytes
//! delivered (verified by the sidecar) into staging, a registered buffer or the reply; a local
//! copy that fails its checksum is reported and read again from another replica.

use regolith_proto::checksum;
use regolith_proto::uds::{pb, Op};

use super::*;
use crate::gather;

impl AsyncClient {
    /// A private copy of the object.
    pub async fn get(&self, key: &str) -> Result<Vec<u8>> {
        let mut last = None;
        for n in 0..ATTEMPTS {
            match self.get_once(key).await {
                Err(e) if e.is_retryable() || matches!(e, Error::Disconnected(_)) => {
                    last = Some(e);
                    if n + 1 < ATTEMPTS {
                        tokio::time::sleep(retry_pause(n)).await;
                    }
                }
                r => return r,
            }
        }
        Err(last.unwrap_or_else(|| Error::Protocol("get not attempted".into())))
    }

    async fn get_once(&self, key: &str) -> Result<Vec<u8>> {
        let s = self.session().await?;
        let inline = pb::Region {
            r#where: Some(pb::region::Where::Inline(pb::Inline {
                data: vec![],
                max_len: uds::MAX_INLINE,
            })),
        };
        let mut item = pb::GetItem {
            key: key.to_string(),
            dest: Some(inline),
            local_ok: true,
            report_mismatch: false,
            mismatched_version: None,
        };
        for _ in 0..2 {
            let r = get_one(&s, item.clone()).await?;
            let code = r.status.as_ref().map(|s| s.code).unwrap_or(0);
            if code == pb::Code::NeedSpace as i32 {
                let held = self.lend(&s, r.size).await?;
                let it = pb::GetItem {
                    key: key.to_string(),
                    dest: Some(held.region(r.size)),
                    local_ok: true,
                    report_mismatch: item.report_mismatch,
                    mismatched_version: item.mismatched_version,
                };
                let out = match get_one(&s, it).await {
                    Ok(r) => match self.finish_get(&s, key, &r, Some(&held)) {
                        Ok(Finish::Local) => self.read_local_vec(&s, key, &r).and_then(|v| {
                            v.ok_or_else(|| Error::Corrupt {
                                key: key.to_string(),
                            })
                        }),
                        Ok(Finish::Done(v)) => Ok(v),
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                };
                self.give_back(vec![held]).await;
                return out;
            }
            match self.finish_get(&s, key, &r, None)? {
                Finish::Done(v) => return Ok(v),
                Finish::Local => match self.read_local_vec(&s, key, &r)? {
                    Some(v) => return Ok(v),
                    None => {
                        item.local_ok = false;
                        item.report_mismatch = true;
                        item.mismatched_version = r.version;
                    }
                },
            }
        }
        Err(Error::Corrupt {
            key: key.to_string(),
        })
    }

    fn finish_get(
        &self,
        s: &Session,
        key: &str,
        r: &pb::GetResult,
        w: Option<&Held>,
    ) -> Result<Finish> {
        if let Some(e) = st_err(key, &r.status) {
            return Err(e);
        }
        if !r.local_extents.is_empty() {
            return Ok(Finish::Local);
        }
        if r.delivered {
            let w = w.ok_or_else(|| Error::Protocol("delivered without a window".into()))?;
            let mut v = vec![0u8; r.size as usize];
            w.read(s, &mut v)?;
            return Ok(Finish::Done(v));
        }
        Ok(Finish::Done(r.data.clone()))
    }

    /// Copies a local replica out and verifies it; None on a checksum mismatch.
    fn read_local_vec(&self, s: &Session, key: &str, r: &pb::GetResult) -> Result<Option<Vec<u8>>> {
        let mut v = vec![0u8; r.size as usize];
        Ok(self.copy_local(s, key, r, &mut v)?.then_some(v))
    }

    fn copy_local(
        &self,
        s: &Session,
        key: &str,
        r: &pb::GetResult,
        dst: &mut [u8],
    ) -> Result<bool> {
        let seg = s.segment.as_ref().ok_or_else(|| {
            Error::Protocol(format!(
                "{key:?}: local extents on a node without a segment"
            ))
        })?;
        let mut hashes = vec![0u64; checksum::chunk_count(r.size)];
        copy_from_extents(
            seg,
            &r.local_extents,
            &mut dst[..r.size as usize],
            r.checksum_seed,
            &mut hashes,
        )?;
        Ok(checksum::combine(r.checksum_seed, &hashes) == r.checksum)
    }

    /// Copies the object into `dst`; returns its size.
    pub async fn get_into(&self, key: &str, dst: Dest<'_>) -> Result<usize> {
        self.batch_get_into(vec![(key, dst)])
            .await
            .pop()
            .unwrap_or_else(|| Err(Error::Protocol("no reply item".into())))
    }

    /// Gets many objects in one round trip (per staging-sized group).
    pub async fn batch_get_into(&self, mut items: Vec<(&str, Dest<'_>)>) -> Vec<Result<usize>> {
        let mut out: Vec<Option<Result<usize>>> = (0..items.len()).map(|_| None).collect();
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
            let sizes: Vec<u64> = items
                .iter()
                .map(|(_, d)| match d {
                    Dest::Bytes(_) | Dest::Parts(_) => d.len() as u64,
                    Dest::Shm { .. } => 0,
                })
                .collect();
            for group in groups(&todo, |i| sizes[i], s.stage.capacity()) {
                let res = self.get_group(&s, &group, &mut items).await;
                for (i, r) in group.into_iter().zip(res) {
                    match r {
                        Err(e) if e.is_retryable() || matches!(e, Error::Disconnected(_)) => {
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
            .map(|o| o.unwrap_or_else(|| Err(Error::Protocol("get not attempted".into()))))
            .collect()
    }

    async fn get_group(
        &self,
        s: &Session,
        group: &[usize],
        items: &mut [(&str, Dest<'_>)],
    ) -> Vec<Result<usize>> {
        let mut windows: Vec<Option<Held>> = Vec::with_capacity(group.len());
        let mut req = pb::GetRequest {
            items: Vec::with_capacity(group.len()),
        };
        for &i in group {
            let (key, dest) = (&items[i].0, &items[i].1);
            let (region, w) = match dest {
                Dest::Bytes(_) | Dest::Parts(_) => match self.lend(s, dest.len() as u64).await {
                    Ok(h) => (h.region(dest.len() as u64), Some(h)),
                    Err(e) => {
                        self.give_back(windows.into_iter().flatten().collect())
                            .await;
                        return group.iter().map(|_| Err(e.clone())).collect();
                    }
                },
                Dest::Shm { buf, offset, len } => match self.registered(s, buf).await {
                    Ok(shm_id) => (
                        pb::Region {
                            r#where: Some(pb::region::Where::Shm(pb::ShmWindow {
                                shm_id,
                                offset: *offset as u64,
                                len: *len as u64,
                            })),
                        },
                        None,
                    ),
                    Err(e) => return group.iter().map(|_| Err(e.clone())).collect(),
                },
            };
            windows.push(w);
            req.items.push(pb::GetItem {
                key: key.to_string(),
                dest: Some(region),
                local_ok: true,
                report_mismatch: false,
                mismatched_version: None,
            });
        }
        let mut results: Vec<Option<Result<usize>>> = (0..group.len()).map(|_| None).collect();
        // Group positions of this round's request items.
        let mut round: Vec<usize> = (0..group.len()).collect();
        for attempt in 0..2 {
            let reply = match s.conn.call::<_, pb::GetReply>(Op::Get, &req).await {
                Ok(r) if r.items.len() == req.items.len() => r,
                Ok(_) => {
                    return group
                        .iter()
                        .map(|_| {
                            Err(Error::Protocol(
                                "get answered the wrong number of items".into(),
                            ))
                        })
                        .collect()
                }
                Err(e) => return group.iter().map(|_| Err(e.clone())).collect(),
            };
            let mut next = pb::GetRequest { items: Vec::new() };
            let mut next_round = Vec::new();
            for (k, r) in reply.items.iter().enumerate() {
                let j = round[k];
                let i = group[j];
                let key = items[i].0.to_string();
                match self.deliver(s, &key, r, &mut items[i].1, windows[j].as_ref()) {
                    Ok(Some(n)) => results[j] = Some(Ok(n)),
                    // The local copy failed verification: ask for another replica, and have the
                    // sidecar count the mismatch.
                    Ok(None) if attempt == 0 => {
                        let mut it = req.items[k].clone();
                        it.local_ok = false;
                        it.report_mismatch = true;
                        it.mismatched_version = r.version;
                        next.items.push(it);
                        next_round.push(j);
                    }
                    Ok(None) => results[j] = Some(Err(Error::Corrupt { key })),
                    Err(e) => results[j] = Some(Err(e)),
                }
            }
            if next.items.is_empty() {
                break;
            }
            req = next;
            round = next_round;
        }
        drop(windows);
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::Protocol("item not processed".into()))))
            .collect()
    }

    /// Delivers one get result into its destination; Ok(None) when a local copy failed
    /// verification (the caller asks for another replica).
    fn deliver(
        &self,
        s: &Session,
        key: &str,
        r: &pb::GetResult,
        dest: &mut Dest<'_>,
        w: Option<&Held>,
    ) -> Result<Option<usize>> {
        if let Some(e) = st_err(key, &r.status) {
            if let Error::Server {
                code: pb::Code::NeedSpace,
                ..
            } = e
            {
                return Err(Error::BufferTooSmall {
                    key: key.to_string(),
                    have: dest.len() as u64,
                    need: r.size,
                });
            }
            return Err(e);
        }
        let size = r.size as usize;
        if size > dest.len() {
            return Err(Error::BufferTooSmall {
                key: key.to_string(),
                have: dest.len() as u64,
                need: r.size,
            });
        }
        if !r.local_extents.is_empty() {
            let ok = match dest {
                Dest::Bytes(b) => self.copy_local(s, key, r, b)?,
                Dest::Shm { buf, offset, .. } => {
                    let mut tmp_hashes = vec![0u64; checksum::chunk_count(r.size)];
                    let seg = s
                        .segment
                        .as_ref()
                        .ok_or_else(|| Error::Protocol("local extents without a segment".into()))?;
                    // SAFETY: `slice_mut` bounds-checks against the buffer's mapping; the slice
                    // lives only for this copy.
                    let d = unsafe { buf.inner.map.slice_mut(*offset as u64, r.size)? };
                    copy_from_extents(seg, &r.local_extents, d, r.checksum_seed, &mut tmp_hashes)?;
                    checksum::combine(r.checksum_seed, &tmp_hashes) == r.checksum
                }
                Dest::Parts(parts) => copy_local_into_parts(s, key, r, parts)?,
            };
            return Ok(ok.then_some(size));
        }
        if r.delivered {
            let window = || {
                w.ok_or_else(|| Error::Protocol("delivered into staging without a window".into()))
            };
            match dest {
                Dest::Bytes(b) => window()?.read(s, &mut b[..size])?,
                Dest::Parts(parts) => {
                    let w = window()?;
                    gather::fill(parts, size, |off, piece| w.read_at(s, off, piece))?;
                }
                Dest::Shm { .. } => {}
            }
            return Ok(Some(size));
        }
        match dest {
            Dest::Bytes(b) => {
                let n = r.data.len().min(b.len());
                b[..n].copy_from_slice(&r.data[..n]);
            }
            Dest::Shm { buf, offset, .. } => buf.write(*offset, &r.data)?,
            Dest::Parts(parts) => gather::scatter(parts, 0, &r.data),
        }
        Ok(Some(r.data.len()))
    }

    // ------------------------------------------------------------------ keys
}

enum Finish {
    Local,
    Done(Vec<u8>),
}

async fn get_one(s: &Session, item: pb::GetItem) -> Result<pb::GetResult> {
    let r: pb::GetReply = s
        .conn
        .call(Op::Get, &pb::GetRequest { items: vec![item] })
        .await?;
    r.items
        .into_iter()
        .next()
        .ok_or_else(|| Error::Protocol("get answered no item".into()))
}

/// Copies a local replica into a scatter list, one chunk at a time through a chunk-sized
/// scratch buffer (hashed as it is read, still in cache when it is scattered); whether it
/// verified.
fn copy_local_into_parts(
    s: &Session,
    key: &str,
    r: &pb::GetResult,
    parts: &mut [&mut [u8]],
) -> Result<bool> {
    let seg = s.segment.as_ref().ok_or_else(|| {
        Error::Protocol(format!(
            "{key:?}: local extents on a node without a segment"
        ))
    })?;
    let size = r.size as usize;
    let mut hashes = vec![0u64; checksum::chunk_count(r.size)];
    let mut scratch = vec![0u8; checksum::CHUNK.min(size)];
    let mut off = 0usize;
    for e in &r.local_extents {
        let n = (e.len as usize).min(size - off);
        let mut done = 0usize;
        while done < n {
            let m = checksum::CHUNK.min(n - done);
            let chunk = (off + done) / checksum::CHUNK;
            seg.read_hashed(
                e.offset + done as u64,
                &mut scratch[..m],
                r.checksum_seed,
                &mut hashes[chunk..=chunk],
            )?;
            gather::scatter(parts, off + done, &scratch[..m]);
            done += m;
        }
        off += n;
        if off >= size {
            break;
        }
    }
    if off < size {
        return Err(Error::Protocol(format!(
            "{key:?}: local extents hold {off} of {size} bytes"
        )));
    }
    Ok(checksum::combine(r.checksum_seed, &hashes) == r.checksum)
}

/// Copies an object out of its extents of the segment into `dst`, hashing chunks.
fn copy_from_extents(
    seg: &Mapping,
    extents: &[pb::Extent],
    dst: &mut [u8],
    seed: u64,
    hashes: &mut [u64],
) -> Result<()> {
    let mut off = 0usize;
    let total = dst.len();
    for e in extents {
        if off >= total {
            break;
        }
        let n = (e.len as usize).min(total - off);
        let first_chunk = off / checksum::CHUNK;
        seg.read_hashed(
            e.offset,
            &mut dst[off..off + n],
            seed,
            &mut hashes[first_chunk..],
        )?;
        off += n;
    }
    if off < total {
        return Err(Error::Protocol(format!(
            "local extents hold {off} of {total} bytes"
        )));
    }
    Ok(())
}
