//! Key operations: exists (no lease: design §5), sizes, remove, remove-all.

use regolith_proto::metad as mpb;
use regolith_proto::uds::pb::Code;

use super::metad::Replica;
use super::{code_of, metad_failure, Failure, Outcome, Store, MAX_KEYS};

fn check_count(n: usize) -> Outcome<()> {
    if n > MAX_KEYS {
        return Err(Failure::invalid("too many keys"));
    }
    Ok(())
}

/// Whether each key exists. Keys the node's index holds (while it is synced) answer yes
/// from it; the others, and all of them without the index, ask the leader: a put made through
/// another node is never missed, only a remove made there may show up to the index's
/// staleness bound late (a stale yes is harmless: the get that follows verifies). Never a
/// lease (design §5).
pub async fn exists(store: &Store, keys: Vec<String>) -> Outcome<Vec<bool>> {
    check_count(keys.len())?;
    let Some(mut found) = store.index.exists(&keys) else {
        store.count_answers("exists", "metad", keys.len());
        return leader_exists(store, keys).await;
    };
    let absent: Vec<usize> = (0..keys.len()).filter(|&i| !found[i]).collect();
    store.count_answers("exists", "index", keys.len() - absent.len());
    if absent.is_empty() {
        return Ok(found);
    }
    store.count_answers("exists", "metad", absent.len());
    let asked = absent.iter().map(|&i| keys[i].clone()).collect();
    let answers = leader_exists(store, asked).await?;
    if answers.len() != absent.len() {
        return Err(Failure::new(
            Code::Internal,
            format!(
                "metad answered {} of {} exists",
                answers.len(),
                absent.len()
            ),
        ));
    }
    for (i, yes) in absent.into_iter().zip(answers) {
        found[i] = yes;
    }
    Ok(found)
}

async fn leader_exists(store: &Store, keys: Vec<String>) -> Outcome<Vec<bool>> {
    store
        .metad
        .exists(keys)
        .await
        .map_err(|e| metad_failure(&e))
}

/// Each key's size (0 where the key cannot be read), with its own outcome.
pub async fn sizes(
    store: &Store,
    keys: Vec<String>,
) -> Outcome<Vec<(Outcome<()>, u64, Vec<Replica>)>> {
    check_count(keys.len())?;
    let placements = store
        .metad
        .placements(keys, store.node_id())
        .await
        .map_err(|e| metad_failure(&e))?;
    Ok(placements
        .into_iter()
        .map(|p| match p {
            Ok(p) => (Ok(()), p.size, p.replicas),
            Err(r) => (Err(Failure::from(&r)), 0, Vec::new()),
        })
        .collect())
}

/// One page of the cluster's keys, from the leader.
pub async fn list_keys(store: &Store, req: mpb::ListKeysRequest) -> Outcome<mpb::ListKeysResponse> {
    store
        .metad
        .list_keys(req)
        .await
        .map_err(|e| metad_failure(&e))
}

/// Removes `keys`; one outcome per key.
pub async fn remove(store: &Store, keys: Vec<String>) -> Outcome<Vec<Outcome<()>>> {
    check_count(keys.len())?;
    let removed = store
        .metad
        .remove(keys.clone())
        .await
        .map_err(|e| metad_failure(&e))?;
    let codes = removed
        .codes
        .iter()
        .copied()
        .chain(std::iter::repeat(mpb::Code::Internal));
    let out: Vec<Outcome<()>> = keys
        .iter()
        .zip(codes)
        .map(|(k, c)| remove_status(k, c, removed.failed_attempts))
        .collect();
    for (k, o) in keys.iter().zip(&out) {
        if o.is_ok() {
            store.index.local_remove(k);
        }
    }
    Ok(out)
}

/// One key's answer to a remove. NOT_FOUND after an attempt that got no answer is no proof the
/// key was absent — that attempt may have removed it — so it answers TIMEOUT (outcome unknown).
fn remove_status(key: &str, code: mpb::Code, failed_attempts: u32) -> Outcome<()> {
    match code_of(code) {
        Code::Ok => Ok(()),
        Code::NotFound if failed_attempts > 0 => Err(Failure::new(
            Code::Timeout,
            format!(
                "{key:?}: outcome unknown: not found now, but an earlier attempt got no answer \
                 and may have removed it"
            ),
        )),
        code => Err(Failure::new(code, format!("{key:?}: {code:?}"))),
    }
}

/// Removes every object; answers how many.
pub async fn remove_all(store: &Store) -> Outcome<u64> {
    let n = store
        .metad
        .remove_all()
        .await
        .map_err(|e| metad_failure(&e))?;
    store.index.local_remove_all();
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_after_an_unanswered_remove_attempt_is_outcome_unknown() {
        let not_found = mpb::Code::NotFound;
        let code = |o: Outcome<()>| o.err().map(|f| f.code).unwrap_or(Code::Ok);
        assert_eq!(code(remove_status("k", not_found, 0)), Code::NotFound);
        assert_eq!(code(remove_status("k", not_found, 1)), Code::Timeout);
        assert_eq!(code(remove_status("k", mpb::Code::Ok, 2)), Code::Ok);
    }
}
