//! The node's persistent identity: `<state-dir>/node.json` with its name and the node id metad
//! assigned at the first mount. A restart reuses both, so metad sees the same node come back
//! (with a new generation).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeState {
    pub node_name: String,
    pub node_id: u64,
}

pub fn path(dir: &Path) -> PathBuf {
    dir.join("node.json")
}

fn err(p: &Path, reason: String) -> Error {
    Error::StateFile {
        path: p.display().to_string(),
        reason,
    }
}

/// The saved state, if any. A file naming another node is an error (two sidecars sharing a
/// state dir would steal each other's identity).
pub fn load(dir: &Path, node_name: &str) -> Result<Option<NodeState>> {
    let p = path(dir);
    let text = match std::fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err(&p, e.to_string())),
    };
    let st: NodeState = serde_json::from_str(&text).map_err(|e| {
        err(
            &p,
            format!("unreadable ({e}); remove it to start as a new node"),
        )
    })?;
    if st.node_name != node_name {
        return Err(err(
            &p,
            format!(
                "belongs to node {:?}, not {node_name:?} (use another --state-dir)",
                st.node_name
            ),
        ));
    }
    Ok(Some(st))
}

/// Saves atomically (temp file, fsync, rename).
pub fn save(dir: &Path, st: &NodeState) -> Result<()> {
    use std::io::Write;
    regolith_proto::daemon::private_dir(dir)
        .map_err(|e| err(dir, format!("cannot create (mode 0700): {e}")))?;
    let p = path(dir);
    let tmp = dir.join("node.json.tmp");
    let body = serde_json::to_vec_pretty(st).map_err(|e| err(&p, e.to_string()))?;
    let mut f = std::fs::File::create(&tmp).map_err(|e| err(&tmp, e.to_string()))?;
    f.write_all(&body)
        .and_then(|_| f.sync_all())
        .map_err(|e| err(&tmp, e.to_string()))?;
    std::fs::rename(&tmp, &p).map_err(|e| err(&p, e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_foreign_file() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(load(d.path(), "a").unwrap(), None);
        let st = NodeState {
            node_name: "a".into(),
            node_id: 7,
        };
        save(d.path(), &st).unwrap();
        assert_eq!(load(d.path(), "a").unwrap(), Some(st));
        assert!(load(d.path(), "b")
            .unwrap_err()
            .to_string()
            .contains("belongs to node"));
        std::fs::write(path(d.path()), "{not json").unwrap();
        assert!(load(d.path(), "a").is_err());
    }
}
