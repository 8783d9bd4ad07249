//! The stable-toolchain runner: no coverage feedback, but cheap structure-blind mutations of
//! valid encodings find what matters most in these decoders (lengths, offsets, tags, caps).
//!
//! A run replays every file of `corpus/<target>/`, then mutates for `REGOLITH_FUZZ_SECS`
//! seconds (default 2) with an RNG seeded by `REGOLITH_FUZZ_SEED` (default: from the target's
//! name, so a CI failure reproduces). Each input runs under `catch_unwind`; the first panic
//! writes the input to `artifacts/<target>/crash-<hash>` and fails the run with it in hex.

use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::Target;

/// Inputs stay below this: the decoders' interesting cases are all in the first bytes, and
/// larger inputs only slow the run.
const MAX_INPUT: usize = 64 * 1024;
/// Mutated inputs kept as parents for further mutation (a random walk away from the seeds).
const POOL: usize = 256;
/// Bytes worth writing anywhere: zero, all ones, the sign bits.
const BYTES: [u8; 4] = [0, 0xff, 0x7f, 0x80];
/// Little-endian values worth writing at a length or offset: zero, one, the edges of each width.
const WORDS: [u64; 10] = [
    0,
    1,
    0x7f,
    0xff,
    0xffff,
    0x7fff_ffff,
    u32::MAX as u64,
    1 << 32,
    1 << 63,
    u64::MAX,
];

/// What a run did.
#[derive(Debug, Clone)]
pub struct Report {
    pub target: &'static str,
    pub corpus: usize,
    pub execs: u64,
    pub elapsed: Duration,
}

impl Report {
    pub fn execs_per_sec(&self) -> f64 {
        self.execs as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} corpus files, {} executions in {:.1} s ({:.0}/s)",
            self.target,
            self.corpus,
            self.execs,
            self.elapsed.as_secs_f64(),
            self.execs_per_sec()
        )
    }
}

/// A panicking input, written to `artifact`.
#[derive(Debug)]
pub struct Crash {
    pub target: &'static str,
    pub input: Vec<u8>,
    pub message: String,
    pub artifact: Option<PathBuf>,
}

impl std::fmt::Display for Crash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} panicked: {}\ninput ({} bytes, saved at {:?}): {}",
            self.target,
            self.message,
            self.input.len(),
            self.artifact,
            hex(&self.input)
        )
    }
}

/// How long and from where.
#[derive(Debug, Clone)]
pub struct Options {
    pub duration: Duration,
    pub seed: Option<u64>,
    pub corpus_root: PathBuf,
    pub artifact_root: PathBuf,
}

impl Options {
    /// From the environment, with the crate's `corpus/` and `artifacts/`.
    pub fn from_env() -> Self {
        let secs = std::env::var("REGOLITH_FUZZ_SECS")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .unwrap_or(2.0);
        let seed = std::env::var("REGOLITH_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok());
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        Self {
            duration: Duration::from_secs_f64(secs),
            seed,
            corpus_root: root.join("corpus"),
            artifact_root: root.join("artifacts"),
        }
    }
}

/// Replays the corpus of `target`, then mutates for the budget.
pub fn run(target: Target, opts: &Options) -> Result<Report, Box<Crash>> {
    let started = Instant::now();
    let corpus = load_corpus(&opts.corpus_root.join(target.name));
    let mut execs = 0u64;
    for input in &corpus {
        execute(target, input, opts)?;
        execs += 1;
    }
    let seed = opts.seed.unwrap_or_else(|| name_seed(target.name));
    let mut rng = StdRng::seed_from_u64(seed);
    let mut pool: Vec<Vec<u8>> = Vec::new();
    let deadline = started + opts.duration;
    while Instant::now() < deadline {
        // Batches keep the clock out of the loop's cost.
        for _ in 0..64 {
            let input = next_input(&mut rng, &corpus, &pool);
            execute(target, &input, opts)?;
            execs += 1;
            remember(&mut rng, &mut pool, input);
        }
    }
    Ok(Report {
        target: target.name,
        corpus: corpus.len(),
        execs,
        elapsed: started.elapsed(),
    })
}

/// Runs one input; a panic becomes a [`Crash`] with its artifact written.
fn execute(target: Target, input: &[u8], opts: &Options) -> Result<(), Box<Crash>> {
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| (target.run)(input)));
    match outcome {
        Ok(()) => Ok(()),
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "non-string panic".into());
            let artifact = save_artifact(&opts.artifact_root.join(target.name), input);
            Err(Box::new(Crash {
                target: target.name,
                input: input.to_vec(),
                message,
                artifact,
            }))
        }
    }
}

fn save_artifact(dir: &Path, input: &[u8]) -> Option<PathBuf> {
    let path = dir.join(format!("crash-{:016x}", xxhash_rust::xxh3::xxh3_64(input)));
    std::fs::create_dir_all(dir).ok()?;
    std::fs::write(&path, input).ok()?;
    Some(path)
}

/// Every file of `dir`, sorted by name (a missing directory is an empty corpus).
pub fn load_corpus(dir: &Path) -> Vec<Vec<u8>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    paths.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

/// A stable seed per target name (FNV-1a), so each target explores its own sequence.
fn name_seed(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// A parent (seed or pool), then one to four stacked mutations.
fn next_input(rng: &mut StdRng, corpus: &[Vec<u8>], pool: &[Vec<u8>]) -> Vec<u8> {
    let mut input = pick_parent(rng, corpus, pool);
    for _ in 0..rng.gen_range(1..=4) {
        mutate(rng, &mut input, corpus);
    }
    input.truncate(MAX_INPUT);
    input
}

fn pick_parent(rng: &mut StdRng, corpus: &[Vec<u8>], pool: &[Vec<u8>]) -> Vec<u8> {
    let from_pool = !pool.is_empty() && (corpus.is_empty() || rng.gen_bool(0.3));
    let source = if from_pool { pool } else { corpus };
    if source.is_empty() {
        return Vec::new();
    }
    source[rng.gen_range(0..source.len())].clone()
}

/// Keeps some mutated inputs as parents, replacing at random once the pool is full.
fn remember(rng: &mut StdRng, pool: &mut Vec<Vec<u8>>, input: Vec<u8>) {
    if !rng.gen_bool(0.05) {
        return;
    }
    if pool.len() < POOL {
        pool.push(input);
    } else {
        let i = rng.gen_range(0..POOL);
        pool[i] = input;
    }
}

/// One mutation, chosen at random.
pub fn mutate(rng: &mut StdRng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    match rng.gen_range(0..9) {
        0 => flip_bit(rng, input),
        1 => set_interesting_byte(rng, input),
        2 => set_random_byte(rng, input),
        3 => insert_bytes(rng, input),
        4 => delete_range(rng, input),
        5 => duplicate_range(rng, input),
        6 => resize(rng, input),
        7 => splice(rng, input, corpus),
        _ => write_word(rng, input),
    }
}

fn flip_bit(rng: &mut StdRng, input: &mut [u8]) {
    if let Some(i) = index(rng, input.len()) {
        input[i] ^= 1 << rng.gen_range(0..8);
    }
}

fn set_interesting_byte(rng: &mut StdRng, input: &mut [u8]) {
    if let Some(i) = index(rng, input.len()) {
        input[i] = BYTES[rng.gen_range(0..BYTES.len())];
    }
}

fn set_random_byte(rng: &mut StdRng, input: &mut [u8]) {
    if let Some(i) = index(rng, input.len()) {
        input[i] = rng.gen();
    }
}

fn insert_bytes(rng: &mut StdRng, input: &mut Vec<u8>) {
    let at = rng.gen_range(0..=input.len());
    let n = rng.gen_range(1..=16);
    let fill: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
    input.splice(at..at, fill);
}

fn delete_range(rng: &mut StdRng, input: &mut Vec<u8>) {
    if let Some((start, end)) = range(rng, input.len()) {
        input.drain(start..end);
    }
}

fn duplicate_range(rng: &mut StdRng, input: &mut Vec<u8>) {
    if let Some((start, end)) = range(rng, input.len()) {
        let copy = input[start..end].to_vec();
        let at = rng.gen_range(0..=input.len());
        input.splice(at..at, copy);
    }
}

/// Truncates (most decoders must refuse a short input) or extends with zeros or random bytes.
fn resize(rng: &mut StdRng, input: &mut Vec<u8>) {
    if !input.is_empty() && rng.gen_bool(0.5) {
        let n = rng.gen_range(0..input.len());
        input.truncate(n);
    } else {
        let n = rng.gen_range(1..=64);
        let zeros = rng.gen_bool(0.5);
        input.extend((0..n).map(|_| if zeros { 0 } else { rng.gen() }));
    }
}

/// A prefix of this input, then a suffix of another corpus entry.
fn splice(rng: &mut StdRng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    if corpus.is_empty() {
        return;
    }
    let other = &corpus[rng.gen_range(0..corpus.len())];
    let cut = rng.gen_range(0..=input.len());
    let from = rng.gen_range(0..=other.len());
    input.truncate(cut);
    input.extend_from_slice(&other[from..]);
}

/// An interesting value as a little-endian u16, u32 or u64 at a random offset.
fn write_word(rng: &mut StdRng, input: &mut [u8]) {
    let width = [2usize, 4, 8][rng.gen_range(0..3)];
    if input.len() < width {
        return;
    }
    let mut value = WORDS[rng.gen_range(0..WORDS.len())];
    if rng.gen_bool(0.2) {
        // Off by one either side of an edge.
        value = if rng.gen() {
            value.wrapping_add(1)
        } else {
            value.wrapping_sub(1)
        };
    }
    let at = rng.gen_range(0..=input.len() - width);
    input[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
}

fn index(rng: &mut StdRng, len: usize) -> Option<usize> {
    (len > 0).then(|| rng.gen_range(0..len))
}

fn range(rng: &mut StdRng, len: usize) -> Option<(usize, usize)> {
    let start = index(rng, len)?;
    let end = rng.gen_range(start + 1..=len.min(start + 64));
    Some((start, end))
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
