//! How a replica on a node's disk tier is named in placements (docs/ssd.md): by its node and
//! a reserved *disk generation*, `DISK_GENERATION_BASE + disk`, where memory segments use
//! generations counted up from 1. A disk replica has one extent, `(0, size)`; the node that
//! owns the disk finds the record by the object's version. Placements, the change feed, the
//! node index and data-plane requests carry disk replicas with no change of format.

/// The first disk generation; memory generations stay below it (the state machine refuses to
/// go past `u32::MAX` generations, and disk numbers are small).
pub const DISK_GENERATION_BASE: u64 = 0xFFFF_0000;
/// Disks per node that can be named.
pub const MAX_DISKS: u32 = 0xFFFF;

/// The generation that names disk `disk` of a node.
pub fn disk_generation(disk: u32) -> u64 {
    DISK_GENERATION_BASE + disk.min(MAX_DISKS) as u64
}

/// Whether a generation names a disk rather than a memory segment.
pub fn is_disk_generation(generation: u64) -> bool {
    (DISK_GENERATION_BASE..=DISK_GENERATION_BASE + MAX_DISKS as u64).contains(&generation)
}

/// The disk a disk generation names.
pub fn disk_of(generation: u64) -> Option<u32> {
    is_disk_generation(generation).then(|| (generation - DISK_GENERATION_BASE) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_generations_are_apart_from_memory_ones() {
        assert!(!is_disk_generation(1));
        assert!(!is_disk_generation(u32::MAX as u64 - 0x1_0000));
        assert_eq!(disk_of(disk_generation(0)), Some(0));
        assert_eq!(disk_of(disk_generation(7)), Some(7));
        assert_eq!(disk_of(5), None);
        assert!(!is_disk_generation(
            DISK_GENERATION_BASE + MAX_DISKS as u64 + 1
        ));
    }
}
