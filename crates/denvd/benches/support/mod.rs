//! What the benchmarks share.

use std::io::Write;
use std::path::Path;

/// Fills `dir` with `mib` MiB of incompressible data in 64 files (`f00` … `f63`), each
/// synced to disk.
pub fn fill(dir: &Path, mib: u64) {
    let files = 64u64;
    let per = (mib << 20) / files;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut buf = vec![0u8; per as usize];
    for i in 0..files {
        for chunk in buf.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = x.to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
        let mut f = std::fs::File::create(dir.join(format!("f{i:02}"))).unwrap();
        f.write_all(&buf).unwrap();
        f.sync_all().unwrap();
    }
}
