//! Microbenchmarks of the UDS frame codec (`proto/src/frame.rs`), each beside the machine's own
//! ceiling for the same bytes:
//!
//! * `frame/encode/<body>`: `encode` into a reused `Vec`, `encode_to_vec` (fresh `Vec`) and the
//!   `FrameCodec` encoder into a reused `BytesMut`, next to plain `Vec` pushes of the same 14
//!   header bytes and body (`vec_push` reused, `vec_push_fresh` into a fresh `Vec`).
//! * `frame/decode/<body>`: `decode_exact` (copies the body out) and `FrameCodec::feed` +
//!   `next_frame` (one copy into the codec's buffer, then zero-copy split), next to one plain copy
//!   of the same bytes into a reused buffer (`copy_reused`) and into a fresh `Vec` (`copy_fresh`).
//! * `frame/decode_stream`: 1024 small frames fed at once and drained, next to one copy of the
//!   same buffer plus a walk over its length fields (`copy_and_walk`).
//!
//! Run: `cargo bench -p regolith-proto --bench frame`. Under `cargo test --benches` every
//! benchmark runs once (criterion's test mode).

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use regolith_proto::frame::{
    self, Frame, FrameCodec, DEFAULT_MAX_LENGTH, HEADER_LEN, LENGTH_FIELD,
};
use tokio_util::codec::Encoder;

/// Body sizes: a small protobuf request, a page, an inline value.
const BODIES: [usize; 3] = [64, 4096, 1 << 20];
const OPCODE: u16 = 0x0102;
const REQUEST_ID: u64 = 0x0807_0605_0403_0201;

fn body(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + 7) as u8).collect()
}

fn label(len: usize) -> String {
    match len {
        n if n >= 1 << 20 => format!("{}MiB", n >> 20),
        n if n >= 1 << 10 => format!("{}KiB", n >> 10),
        n => format!("{n}B"),
    }
}

fn encode(c: &mut Criterion) {
    let mut g = c.benchmark_group("frame/encode");
    for len in BODIES {
        let body = body(len);
        let header = frame::header(OPCODE, REQUEST_ID, len, DEFAULT_MAX_LENGTH).unwrap();
        let total = HEADER_LEN + len;
        g.throughput(Throughput::Bytes(total as u64));
        let id = |name: &str| BenchmarkId::new(name, label(len));

        let mut v: Vec<u8> = Vec::with_capacity(total);
        g.bench_function(id("ceiling_vec_push"), |b| {
            b.iter(|| {
                v.clear();
                v.extend_from_slice(black_box(&header));
                v.extend_from_slice(black_box(&body));
                black_box(v.as_ptr());
            })
        });
        g.bench_function(id("ceiling_vec_push_fresh"), |b| {
            b.iter(|| {
                let mut v = Vec::with_capacity(total);
                v.extend_from_slice(black_box(&header));
                v.extend_from_slice(black_box(&body));
                v
            })
        });
        g.bench_function(id("encode"), |b| {
            b.iter(|| {
                v.clear();
                frame::encode(
                    black_box(OPCODE),
                    black_box(REQUEST_ID),
                    black_box(&body),
                    DEFAULT_MAX_LENGTH,
                    &mut v,
                )
                .unwrap();
                black_box(v.as_ptr());
            })
        });
        g.bench_function(id("encode_to_vec"), |b| {
            b.iter(|| {
                frame::encode_to_vec(black_box(OPCODE), black_box(REQUEST_ID), black_box(&body))
                    .unwrap()
            })
        });
        let item = Frame::new(OPCODE, REQUEST_ID, body.clone());
        let mut codec = FrameCodec::default();
        let mut dst = BytesMut::with_capacity(total);
        g.bench_function(id("codec_encode"), |b| {
            b.iter(|| {
                dst.clear();
                Encoder::<&Frame>::encode(&mut codec, black_box(&item), &mut dst).unwrap();
                black_box(dst.as_ptr());
            })
        });
    }
    g.finish();
}

fn decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("frame/decode");
    for len in BODIES {
        let wire = frame::encode_to_vec(OPCODE, REQUEST_ID, &body(len)).unwrap();
        g.throughput(Throughput::Bytes(wire.len() as u64));
        let id = |name: &str| BenchmarkId::new(name, label(len));

        let mut buf: Vec<u8> = Vec::with_capacity(wire.len());
        g.bench_function(id("ceiling_copy_reused"), |b| {
            b.iter(|| {
                buf.clear();
                buf.extend_from_slice(black_box(&wire));
                black_box(buf.as_ptr());
            })
        });
        g.bench_function(id("ceiling_copy_fresh"), |b| {
            b.iter(|| black_box(&wire[..]).to_vec())
        });
        g.bench_function(id("decode_exact"), |b| {
            b.iter(|| frame::decode_exact(black_box(&wire), DEFAULT_MAX_LENGTH).unwrap())
        });
        let mut codec = FrameCodec::default();
        g.bench_function(id("codec_feed_next"), |b| {
            b.iter(|| {
                codec.feed(black_box(&wire));
                codec.next_frame().unwrap().unwrap()
            })
        });
    }
    g.finish();
}

/// Many small frames arriving in one read, as on a busy UDS connection.
fn decode_stream(c: &mut Criterion) {
    const FRAMES: usize = 1024;
    const BODY: usize = 64;
    let mut wire = Vec::new();
    for i in 0..FRAMES as u64 {
        frame::encode(OPCODE, i, &body(BODY), DEFAULT_MAX_LENGTH, &mut wire).unwrap();
    }
    let mut g = c.benchmark_group("frame/decode_stream");
    g.throughput(Throughput::Elements(FRAMES as u64));
    let id = |name: &str| BenchmarkId::new(name, format!("{FRAMES}x{BODY}B"));

    let mut buf: Vec<u8> = Vec::with_capacity(wire.len());
    g.bench_function(id("ceiling_copy_and_walk"), |b| {
        b.iter(|| {
            buf.clear();
            buf.extend_from_slice(black_box(&wire));
            let (mut at, mut n) = (0usize, 0usize);
            while at + LENGTH_FIELD <= buf.len() {
                let l = u32::from_le_bytes(buf[at..at + 4].try_into().unwrap()) as usize;
                at += LENGTH_FIELD + l;
                n += 1;
            }
            black_box(n)
        })
    });
    let mut codec = FrameCodec::default();
    g.bench_function(id("codec_feed_drain"), |b| {
        b.iter(|| {
            codec.feed(black_box(&wire));
            let mut n = 0usize;
            while let Some(f) = codec.next_frame().unwrap() {
                black_box(&f);
                n += 1;
            }
            assert_eq!(n, FRAMES);
        })
    });
    g.finish();
}

criterion_group!(benches, encode, decode, decode_stream);
criterion_main!(benches);
