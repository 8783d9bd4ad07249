//! A snapshot of a state whose objects have replicas on a node's disk tier restores (found by
//! the chaos suite: a replica restarted from such a snapshot refused it, "snapshot object ...
//! is on unmounted segment node N gen 4294901760", and exited at every restart).

use regolith_metad::command::{Command, DiskMove, Outcome};
use regolith_metad::state::StateMachine;
use regolith_metad::types::{Extent, Pin, Replica, Version};

#[test]
fn a_snapshot_with_disk_replicas_restores() {
    let mut sm = StateMachine::new();
    let mount = Command::MountSegment {
        node_name: "a".into(),
        node_id_hint: 0,
        capacity: 1 << 20,
        data_addrs: vec![],
        now_ms: 0,
    };
    sm.apply(&mount, &mut Vec::new());
    let seg = sm.segments().next().unwrap().id;
    let version = Version { term: 1, id: 1 };
    let put = Command::CommitPut {
        key: "k".into(),
        size: 100,
        replicas: vec![Replica {
            segment: seg,
            extents: vec![Extent::new(0, 128)],
        }],
        checksum: 0,
        version,
        pin: Pin::None,
        expires_ms: 0,
    };
    assert_eq!(sm.apply(&put, &mut Vec::new()), Outcome::Committed);
    let moved = sm.apply(
        &Command::MoveToDisk {
            node: seg.node,
            items: vec![DiskMove {
                key: "k".into(),
                version,
                disk: 0,
            }],
        },
        &mut Vec::new(),
    );
    assert_eq!(moved, Outcome::MovedToDisk(vec![true]));
    let bytes = sm.snapshot_bytes();
    let restored = StateMachine::read_snapshot(&mut bytes.as_slice()).expect("restores");
    assert_eq!(restored.snapshot_bytes(), bytes);
    let o = restored.object("k").expect("the object is there");
    assert_eq!(o.replicas.disk_on(seg.node), Some(0));
    assert_eq!(restored.bytes_used(), 0, "a disk replica holds no memory");
}
