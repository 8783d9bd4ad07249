//! Fault schedules, generated from a seed so a run can be repeated: the quick profile (every
//! fault once, a few seconds each) and the long profile (random faults for a duration).

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::nemesis::{DiskFailure, Fault, OneWay};

/// One step: inject `fault`, hold it for `hold`, heal.
#[derive(Clone, Debug)]
pub struct Step {
    pub fault: Fault,
    pub hold: Duration,
}

/// How long a fault is held by default. Pauses must outlast the election timeout, a host
/// cut-off the node TTL ([`crate::cluster::NODE_TTL`]) so that metad declares it dead.
pub fn default_hold(fault: &Fault) -> Duration {
    match fault {
        Fault::PauseLeader => Duration::from_millis(2500),
        Fault::HostCutoff { .. } | Fault::PauseAll => {
            crate::cluster::NODE_TTL + Duration::from_millis(1500)
        }
        Fault::RestartAll => Duration::from_millis(1500),
        Fault::MembershipChange => Duration::from_millis(2000),
        Fault::KillLeader
        | Fault::LeaderHandover
        | Fault::SidecarCrash { .. }
        | Fault::SidecarUpgrade { .. } => Duration::from_millis(2000),
        // Below the index's staleness bound (2 s, and the checker's 2.5 s): a lag longer than
        // that is what the bound exists to stop, and the checker would rightly flag it.
        Fault::IndexLag { .. } => INDEX_LAG_HOLD,
        // Long enough for every probe kind to reach every daemon several times.
        Fault::ByzantineClient => Duration::from_millis(4000),
        // After the sidecar took the disk out (the inject waits for its probe): the node
        // serves without it for a while before the disk is replaced.
        Fault::DiskFail { .. } => Duration::from_millis(1500),
        // Down for well under the node TTL: a warm restart, not a node declared dead.
        Fault::SidecarRestartWarm { .. } => Duration::from_millis(1000),
        _ => Duration::from_millis(3000),
    }
}

/// How long an index lag is held; never more, in any profile.
pub const INDEX_LAG_HOLD: Duration = Duration::from_millis(1500);

fn sidecar_host(rng: &mut StdRng) -> String {
    format!("s{}", rng.gen_range(1..=3))
}

/// Every fault once, with targets drawn from `rng`. The sidecar upgrade, the disk failure
/// and the warm restart go to three different hosts: a hand-over does not carry the disks yet
/// (docs/ssd.md), so a disk fault on the upgraded host would find its disk out already.
fn every_fault(rng: &mut StdRng, data_plane: bool) -> Vec<Fault> {
    let one_way = if rng.gen_bool(0.5) {
        OneWay::LeaderDeaf
    } else {
        OneWay::LeaderMute
    };
    let mut distinct = ["s1".to_string(), "s2".into(), "s3".into()];
    distinct.shuffle(rng);
    let how = if rng.gen_bool(0.5) {
        DiskFailure::Removed
    } else {
        DiskFailure::ReadOnly
    };
    let faults = vec![
        Fault::KillLeader,
        Fault::LeaderHandover,
        Fault::PauseLeader,
        Fault::IsolateLeader,
        Fault::OneWayLeader(one_way),
        Fault::SplitLeaderMinority,
        Fault::PacketLoss {
            percent: rng.gen_range(20..=40),
        },
        Fault::RestartAll,
        Fault::PauseAll,
        Fault::MembershipChange,
        Fault::HostCutoff {
            host: sidecar_host(rng),
        },
        Fault::SidecarCrash {
            host: sidecar_host(rng),
        },
        Fault::SidecarUpgrade {
            host: distinct[0].clone(),
        },
        Fault::DiskFail {
            host: distinct[1].clone(),
            how,
        },
        Fault::SidecarRestartWarm {
            host: distinct[2].clone(),
        },
        Fault::IndexLag {
            host: sidecar_host(rng),
        },
        Fault::NicCut {
            host: sidecar_host(rng),
            nic: rng.gen_range(0..2),
        },
        Fault::DataPortLatency {
            delay: Duration::from_millis(rng.gen_range(20..200)),
        },
        Fault::ByzantineClient,
    ];
    faults
        .into_iter()
        .filter(|f| data_plane || !f.needs_data_plane())
        .collect()
}

/// The quick profile: every applicable fault once, in a seeded order.
pub fn quick(seed: u64, data_plane: bool) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut faults = every_fault(&mut rng, data_plane);
    faults.shuffle(&mut rng);
    faults
        .into_iter()
        .map(|fault| Step {
            hold: default_hold(&fault),
            fault,
        })
        .collect()
}

/// The long profile: an endless seeded stream of faults with random hold times (the runner
/// stops taking steps when its duration is spent).
pub fn long(seed: u64, data_plane: bool) -> impl Iterator<Item = Step> {
    let mut rng = StdRng::seed_from_u64(seed);
    std::iter::from_fn(move || {
        let faults = every_fault(&mut rng, data_plane);
        let fault = faults.choose(&mut rng)?.clone();
        let base = default_hold(&fault).as_millis() as u64;
        let mut hold = Duration::from_millis(rng.gen_range(base / 2..=base * 2));
        if matches!(fault, Fault::IndexLag { .. }) {
            hold = hold.min(INDEX_LAG_HOLD);
        }
        Some(Step { fault, hold })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_repeat_with_the_seed() {
        let names = |s: &[Step]| s.iter().map(|x| x.fault.name()).collect::<Vec<_>>();
        assert_eq!(names(&quick(7, false)), names(&quick(7, false)));
        let a: Vec<_> = long(7, false)
            .take(20)
            .map(|s| (s.fault.name(), s.hold))
            .collect();
        let b: Vec<_> = long(7, false)
            .take(20)
            .map(|s| (s.fault.name(), s.hold))
            .collect();
        assert_eq!(a, b);
        let c: Vec<_> = long(8, false)
            .take(20)
            .map(|s| (s.fault.name(), s.hold))
            .collect();
        assert_ne!(a, c);
    }

    #[test]
    fn quick_has_every_fault_once_and_data_plane_faults_only_when_asked() {
        let q = quick(1, false);
        assert_eq!(q.len(), 12);
        assert!(q.iter().all(|s| !s.fault.needs_data_plane()));
        assert_eq!(quick(1, true).len(), 19);
        assert!(quick(1, true).iter().any(|s| s.fault.kind() == "index-lag"));
        assert!(long(5, true)
            .take(300)
            .filter(|s| s.fault.kind() == "index-lag")
            .all(|s| s.hold <= INDEX_LAG_HOLD));
        assert!(q.iter().any(|s| s.fault.kind() == "leader-handover"));
        assert!(quick(1, true)
            .iter()
            .any(|s| s.fault.kind() == "sidecar-upgrade"));
        assert!(quick(1, true)
            .iter()
            .any(|s| s.fault.kind() == "byzantine-client"));
        // The disk faults, on other hosts than the upgrade's.
        for seed in 0..20 {
            let q = quick(seed, true);
            let host_of = |kind: &str| {
                q.iter()
                    .find(|s| s.fault.kind() == kind)
                    .map(|s| s.fault.name().rsplit('-').next().unwrap().to_string())
                    .unwrap()
            };
            let hosts = [
                host_of("sidecar-upgrade"),
                host_of("disk-fail"),
                host_of("sidecar-restart-warm"),
            ];
            assert!(
                hosts[0] != hosts[1] && hosts[1] != hosts[2] && hosts[0] != hosts[2],
                "{hosts:?}"
            );
        }
        assert!(long(9, true)
            .take(300)
            .any(|s| s.fault.kind() == "disk-fail"));
        assert!(long(9, true)
            .take(300)
            .any(|s| s.fault.kind() == "sidecar-restart-warm"));
        assert!(long(3, false)
            .take(100)
            .all(|s| !s.fault.needs_data_plane()));
    }
}
