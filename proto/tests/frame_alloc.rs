//! The frame decoder never makes an allocation sized by the peer: with a counting allocator, the
//! largest single allocation made while decoding hostile input stays within the configured cap.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::BytesMut;
use regolith_proto::frame::{FrameCodec, FrameError, HEADER_LEN};
use tokio_util::codec::Decoder;

struct Counting;
static LARGEST: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static TRACK: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: forwards to the system allocator; only records sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if TRACK.with(|t| t.get()) {
            LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        }
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if TRACK.with(|t| t.get()) {
            LARGEST.fetch_max(n, Ordering::Relaxed);
        }
        System.realloc(p, l, n)
    }
}

#[global_allocator]
static A: Counting = Counting;

fn largest_alloc_decoding(max: u32, input: &[u8]) -> usize {
    let mut codec = FrameCodec::new(max);
    let mut buf = BytesMut::with_capacity(input.len());
    buf.extend_from_slice(input);
    LARGEST.store(0, Ordering::Relaxed);
    TRACK.with(|t| t.set(true));
    loop {
        match codec.decode(&mut buf) {
            Ok(Some(_)) => continue,
            Ok(None) | Err(FrameError::TooLong { .. } | FrameError::TooShort { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    TRACK.with(|t| t.set(false));
    LARGEST.load(Ordering::Relaxed)
}

#[test]
fn peer_announced_lengths_do_not_drive_allocation() {
    let max = 4096u32;
    let bound = 2 * (HEADER_LEN + max as usize);
    for length in [u32::MAX, 1 << 30, max + 1, max, 10, 9, 0] {
        let mut input = length.to_le_bytes().to_vec();
        input.extend_from_slice(&[1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 7]);
        let largest = largest_alloc_decoding(max, &input);
        assert!(
            largest <= bound,
            "length {length}: allocated {largest} > {bound}"
        );
    }
    // Pseudo-random garbage, many seeds.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..2000 {
        let input: Vec<u8> = (0..64)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let largest = largest_alloc_decoding(max, &input);
        assert!(largest <= bound, "allocated {largest} > {bound}");
    }
}
