//! Rewrites the seed corpus: `corpus/<target>/seed-<n>` for every target, from the real
//! encoders. Other files there (regressions: inputs that once crashed) are kept.
//!
//! `cargo run -p regolith-fuzz --bin seed-corpus`

use std::path::Path;

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for t in regolith_fuzz::TARGETS {
        let dir = root.join(t.name);
        std::fs::create_dir_all(&dir)?;
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            let is_seed = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("seed-"));
            if is_seed {
                std::fs::remove_file(&path)?;
            }
        }
        let seeds = regolith_fuzz::seeds::seeds(t.name);
        for (i, s) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), s)?;
        }
        println!("{}: {} seeds", t.name, seeds.len());
    }
    Ok(())
}
