//! The portable form of a snapshot, for shipping it to another host (`snapshot.send`,
//! `snapshot.receive`; `docs/reference/protocol.md`): one uncompressed tar archive (the
//! `tar` crate's GNU format) holding one top-level directory per volume, `<vol>/…`,
//! followed on the wire by a [`TRAILER_BYTES`]-byte trailer (`DENVSHIP`, the archive's
//! size as a big-endian u64, its SHA-256) that the receiver checks before anything is
//! put in place. Every backend writes and reads the same format, so any backend
//! receives from any other.
//!
//! What an archive keeps of each entry: its type (directory, regular file, symlink as a
//! symlink, hard link to an earlier entry, fifo), owner (numeric uid/gid), mode (setuid
//! bits included), mtime, and the `user.*` extended attributes (PAX records). Sockets
//! and device nodes are left out when exporting (a unix socket is meaningless on
//! another host; agents cannot make device nodes without `CAP_MKNOD`). A file with holes
//! is written as a GNU sparse entry holding only its data regions (found with
//! `SEEK_DATA`/`SEEK_HOLE`, else by looking for zero blocks when the file system
//! reports fewer blocks than the size), and unpacked with the same holes: what an agent
//! leaves in a volume (a 1 TiB file of which 4 KiB was written) costs what it holds,
//! not its apparent size, on the wire and on the receiving disk.
//!
//! **The volume content is hostile** (an agent wrote it). [`unpack`] is the one place
//! that writes an archive to disk, and its guarantees do not depend on the sender:
//!
//! - every entry's path is relative, made only of normal components (no `..`, no
//!   absolute path, no `.`), and starts with one of the expected volume names;
//! - no entry is written through a symlink: each existing prefix of its path inside the
//!   staging directory is checked with `lstat` and must be a real directory; an entry
//!   whose own path exists is refused unless both are directories (so a file cannot
//!   replace a symlink planted earlier and then be written through it);
//! - a hard link's target must be an earlier, non-directory entry of the same archive,
//!   reached by the same rules (never a path outside the staging directory);
//! - device nodes (character, block) and unknown entry types are refused; a GNU sparse
//!   entry's map is checked by the `tar` crate (in order, no overlap, within its size);
//! - at most `limit` bytes are read from the stream (the environment's archive limit
//!   the control plane sends); one byte more is an error.
//!
//! A refused archive fails the whole unpack; the caller removes its staging directory.

use super::StorageError;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// What an export wrote: the archive's size in bytes and its SHA-256 (lower-case hex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shipped {
    /// Bytes of the archive, end-of-archive blocks included.
    pub bytes: u64,
    /// SHA-256 of exactly those bytes, lower-case hex.
    pub sha256: String,
}

/// Bytes of the trailer that follows an archive on the wire: the magic `DENVSHIP`, the
/// archive's size (big-endian u64) and its SHA-256 (32 bytes).
pub const TRAILER_BYTES: usize = 48;

const TRAILER_MAGIC: &[u8; 8] = b"DENVSHIP";

/// The trailer describing `shipped` (see [`TRAILER_BYTES`]).
pub fn trailer(shipped: &Shipped) -> std::io::Result<[u8; TRAILER_BYTES]> {
    let mut t = [0u8; TRAILER_BYTES];
    t[..8].copy_from_slice(TRAILER_MAGIC);
    t[8..16].copy_from_slice(&shipped.bytes.to_be_bytes());
    let sha = hex::decode(&shipped.sha256)
        .ok()
        .filter(|d| d.len() == 32)
        .ok_or_else(|| std::io::Error::other("the archive's digest is not 32 bytes of hex"))?;
    t[16..].copy_from_slice(&sha);
    Ok(t)
}

/// Reads a trailer; an error says what is wrong with it.
fn parse_trailer(t: &[u8]) -> Result<Shipped, StorageError> {
    if t.len() != TRAILER_BYTES || &t[..8] != TRAILER_MAGIC {
        return Err(StorageError::Failed(
            "the archive ended without its trailer (the transfer was cut short)".into(),
        ));
    }
    let mut n = [0u8; 8];
    n.copy_from_slice(&t[8..16]);
    Ok(Shipped {
        bytes: u64::from_be_bytes(n),
        sha256: hex::encode(&t[16..]),
    })
}

/// A writer that counts and hashes what passes through it.
pub struct HashingWriter<W: Write> {
    inner: W,
    bytes: u64,
    hash: Sha256,
}

impl<W: Write> HashingWriter<W> {
    /// Wraps `inner`.
    pub fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            bytes: 0,
            hash: Sha256::new(),
        }
    }

    /// Flushes `inner` and returns what was written.
    pub fn finish(mut self) -> std::io::Result<Shipped> {
        self.inner.flush()?;
        Ok(Shipped {
            bytes: self.bytes,
            sha256: hex::encode(self.hash.finalize()),
        })
    }

    /// Writes the [`trailer`] of what was written so far to `inner` (not counted),
    /// flushes, and returns what the trailer describes.
    pub fn finish_with_trailer(mut self) -> std::io::Result<Shipped> {
        let shipped = Shipped {
            bytes: self.bytes,
            sha256: hex::encode(self.hash.clone().finalize()),
        };
        self.inner.write_all(&trailer(&shipped)?)?;
        self.inner.flush()?;
        Ok(shipped)
    }
}

/// A reader that passes on all but the last [`TRAILER_BYTES`] of its stream, which it
/// keeps for [`TrailerReader::trailer`].
pub struct TrailerReader<R: Read> {
    inner: R,
    buf: Vec<u8>,
    start: usize,
    eof: bool,
}

impl<R: Read> TrailerReader<R> {
    /// Wraps `inner`.
    pub fn new(inner: R) -> Self {
        TrailerReader {
            inner,
            buf: Vec::with_capacity(256 << 10),
            start: 0,
            eof: false,
        }
    }

    /// Reads to the end of the stream and returns the trailer it ended with (what the
    /// sender says it sent). Error: the stream is shorter than a trailer, or its last
    /// bytes are not one.
    pub fn trailer(mut self) -> Result<Shipped, StorageError> {
        std::io::copy(&mut self, &mut std::io::sink())
            .map_err(|e| StorageError::Failed(format!("reading the archive: {e}")))?;
        parse_trailer(&self.buf[self.start..])
    }
}

impl<R: Read> Read for TrailerReader<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let ready = (self.buf.len() - self.start).saturating_sub(TRAILER_BYTES);
            if ready > 0 || self.eof {
                let n = ready.min(out.len());
                out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
                self.start += n;
                return Ok(n);
            }
            if self.start > 0 {
                self.buf.drain(..self.start);
                self.start = 0;
            }
            let old = self.buf.len();
            self.buf.resize(old + (128 << 10), 0);
            let n = self.inner.read(&mut self.buf[old..]);
            self.buf.truncate(old + *n.as_ref().unwrap_or(&0));
            if n? == 0 {
                self.eof = true;
            }
        }
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that counts and hashes what it reads, and fails once more than `limit`
/// bytes come.
pub struct HashingReader<R: Read> {
    inner: R,
    bytes: u64,
    limit: u64,
    hash: Sha256,
}

impl<R: Read> HashingReader<R> {
    /// Wraps `inner`, accepting at most `limit` bytes.
    pub fn new(inner: R, limit: u64) -> Self {
        HashingReader {
            inner,
            bytes: 0,
            limit,
            hash: Sha256::new(),
        }
    }

    /// Reads the rest of the stream (still bounded), then returns its size and digest.
    pub fn finish(mut self) -> std::io::Result<Shipped> {
        std::io::copy(&mut self, &mut std::io::sink())?;
        Ok(Shipped {
            bytes: self.bytes,
            sha256: hex::encode(self.hash.finalize()),
        })
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        if self.bytes > self.limit {
            return Err(std::io::Error::other(format!(
                "the archive is larger than the {} bytes announced",
                self.limit
            )));
        }
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// Writes the trees `(volume, directory)` as one archive to `w` (each tree under a
/// top-level directory named after its volume), in path order. Hard links inside the
/// archive are kept as hard links. Errors name the path.
pub fn export_trees(trees: &[(String, PathBuf)], w: &mut dyn Write) -> Result<(), StorageError> {
    let mut b = tar::Builder::new(w);
    b.follow_symlinks(false);
    b.mode(tar::HeaderMode::Complete);
    let mut links: HashMap<(u64, u64), PathBuf> = HashMap::new();
    for (vol, root) in trees {
        for entry in walkdir::WalkDir::new(root)
            .follow_links(false)
            .sort_by_file_name()
        {
            let entry = entry.map_err(|e| StorageError::Failed(format!("reading {vol}: {e}")))?;
            let rel = entry
                .path()
                .strip_prefix(root)
                .expect("walkdir stays under its root");
            let name = Path::new(vol).join(rel);
            let md = entry
                .path()
                .symlink_metadata()
                .map_err(|e| StorageError::io(entry.path(), e))?;
            let ft = md.file_type();
            {
                use std::os::unix::fs::FileTypeExt;
                if ft.is_socket() || ft.is_char_device() || ft.is_block_device() {
                    continue;
                }
            }
            append_xattrs(&mut b, entry.path())?;
            {
                use std::os::unix::fs::FileTypeExt;
                if ft.is_fifo() {
                    // (The tar crate's own path for special files names them by their
                    // source path, not `name`.)
                    let mut h = tar::Header::new_gnu();
                    h.set_metadata_in_mode(&md, tar::HeaderMode::Complete);
                    h.set_entry_type(tar::EntryType::Fifo);
                    h.set_size(0);
                    b.append_data(&mut h, &name, std::io::empty())
                        .map_err(|e| StorageError::io(entry.path(), e))?;
                    continue;
                }
            }
            if ft.is_file() && md.nlink() > 1 {
                let key = (md.dev(), md.ino());
                if let Some(first) = links.get(&key) {
                    let mut h = tar::Header::new_gnu();
                    h.set_metadata_in_mode(&md, tar::HeaderMode::Complete);
                    h.set_entry_type(tar::EntryType::Link);
                    h.set_size(0);
                    b.append_link(&mut h, &name, first)
                        .map_err(|e| StorageError::io(entry.path(), e))?;
                    continue;
                }
                links.insert(key, name.clone());
            }
            if ft.is_file() {
                if let Some(map) = sparse_map(entry.path(), &md)? {
                    append_sparse(&mut b, entry.path(), &name, &md, map)?;
                    continue;
                }
            }
            b.append_path_with_name(entry.path(), &name)
                .map_err(|e| StorageError::io(entry.path(), e))?;
        }
    }
    b.into_inner()
        .and_then(|w| w.flush())
        .map_err(|e| StorageError::Failed(format!("writing the archive: {e}")))
}

/// The data regions `(offset, length)` of a regular file with holes, in order, each
/// starting and (but for one ending at the end of the file) ending on a 512-byte
/// boundary; `None` for a file without holes (written as a plain entry). A file is
/// looked at only when the file system reports fewer blocks than its size; its regions
/// come from `SEEK_DATA`/`SEEK_HOLE`, or, where the file system does not report holes
/// (zfs-fuse), from its all-zero 64 KiB blocks.
fn sparse_map(
    path: &Path,
    md: &std::fs::Metadata,
) -> Result<Option<Vec<(u64, u64)>>, StorageError> {
    let len = md.len();
    if len == 0 || md.blocks().saturating_mul(512) >= len {
        return Ok(None);
    }
    let f = std::fs::File::open(path).map_err(|e| StorageError::io(path, e))?;
    let mut map = seek_map(&f, len).map_err(|e| StorageError::io(path, e))?;
    if map == [(0, len)] {
        map = zero_map(&f, len).map_err(|e| StorageError::io(path, e))?;
    }
    // Whole 512-byte blocks, merged where they meet.
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (off, n) in map {
        let (a, b) = (off / 512 * 512, (off + n).div_ceil(512) * 512);
        let b = b.min(len);
        match out.last_mut() {
            Some((o, l)) if *o + *l >= a => *l = b.max(*o + *l) - *o,
            _ => out.push((a, b - a)),
        }
    }
    if out == [(0, len)] {
        return Ok(None);
    }
    Ok(Some(out))
}

/// Data regions as the file system reports them (`SEEK_DATA`/`SEEK_HOLE`); one region,
/// the whole file, where it does not know of holes.
fn seek_map(f: &std::fs::File, len: u64) -> std::io::Result<Vec<(u64, u64)>> {
    use nix::unistd::{lseek, Whence};
    let mut map = Vec::new();
    let mut pos: i64 = 0;
    let end = len as i64;
    while pos < end {
        let data = match lseek(f, pos, Whence::SeekData) {
            Ok(d) => d,
            Err(nix::errno::Errno::ENXIO) => break,
            Err(nix::errno::Errno::EINVAL) => return Ok(vec![(0, len)]),
            Err(e) => return Err(e.into()),
        };
        if data >= end {
            break;
        }
        let hole = match lseek(f, data, Whence::SeekHole) {
            Ok(h) => h.min(end),
            Err(nix::errno::Errno::ENXIO) => end,
            Err(e) => return Err(e.into()),
        };
        map.push((data as u64, (hole - data) as u64));
        pos = hole;
    }
    Ok(map)
}

/// Data regions found by reading: every 64 KiB block that holds a byte other than 0.
fn zero_map(f: &std::fs::File, len: u64) -> std::io::Result<Vec<(u64, u64)>> {
    use std::os::unix::fs::FileExt;
    const BLOCK: usize = 64 << 10;
    let mut buf = vec![0u8; BLOCK];
    let mut map: Vec<(u64, u64)> = Vec::new();
    let mut off = 0u64;
    while off < len {
        let want = BLOCK.min((len - off) as usize);
        // Positioned reads: the seeks of `seek_map` moved the file's offset.
        f.read_exact_at(&mut buf[..want], off)?;
        if buf[..want].iter().any(|b| *b != 0) {
            match map.last_mut() {
                Some((o, l)) if *o + *l == off => *l += want as u64,
                _ => map.push((off, want as u64)),
            }
        }
        off += want as u64;
    }
    Ok(map)
}

/// Appends the file at `src` as a GNU sparse entry `name` holding only the regions of
/// `map` (see [`sparse_map`]); the map goes in the header and, past four regions, in
/// extension headers before the data.
fn append_sparse<W: Write>(
    b: &mut tar::Builder<W>,
    src: &Path,
    name: &Path,
    md: &std::fs::Metadata,
    map: Vec<(u64, u64)>,
) -> Result<(), StorageError> {
    let len = md.len();
    let mut h = tar::Header::new_gnu();
    h.set_metadata_in_mode(md, tar::HeaderMode::Complete);
    h.set_entry_type(tar::EntryType::GNUSparse);
    h.set_size(map.iter().map(|r| r.1).sum());
    // The last entry marks the end of the file (a trailing hole).
    let mut entries = map.clone();
    entries.push((len, 0));
    let gnu = h.as_gnu_mut().expect("a GNU header");
    gnu.set_real_size(len);
    for (slot, (off, n)) in gnu.sparse.iter_mut().zip(&entries) {
        slot.set_offset(*off);
        slot.set_length(*n);
    }
    let rest = &entries[entries.len().min(4)..];
    gnu.set_is_extended(!rest.is_empty());
    let mut ext = Vec::new();
    for (i, chunk) in rest.chunks(21).enumerate() {
        let mut e = tar::GnuExtSparseHeader::new();
        for (slot, (off, n)) in e.sparse_mut().iter_mut().zip(chunk) {
            slot.set_offset(*off);
            slot.set_length(*n);
        }
        e.set_is_extended((i + 1) * 21 < rest.len());
        ext.extend_from_slice(e.as_bytes());
    }
    let f = std::fs::File::open(src).map_err(|e| StorageError::io(src, e))?;
    let data = std::io::Cursor::new(ext).chain(Regions {
        file: f,
        regions: map.into_iter(),
        left: 0,
    });
    b.append_data(&mut h, name, data)
        .map_err(|e| StorageError::io(src, e))
}

/// Reads the regions of a file one after another.
struct Regions {
    file: std::fs::File,
    regions: std::vec::IntoIter<(u64, u64)>,
    left: u64,
}

impl Read for Regions {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::io::Seek;
        while self.left == 0 {
            let Some((off, n)) = self.regions.next() else {
                return Ok(0);
            };
            self.file.seek(std::io::SeekFrom::Start(off))?;
            self.left = n;
        }
        let want = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        let n = self.file.read(&mut buf[..want])?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file is shorter than its data regions",
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Adds the `user.*` extended attributes of `path` as a PAX header for the next entry.
fn append_xattrs<W: Write>(b: &mut tar::Builder<W>, path: &Path) -> Result<(), StorageError> {
    let Ok(names) = xattr::list(path) else {
        return Ok(());
    };
    let mut pax: Vec<(String, Vec<u8>)> = Vec::new();
    for n in names {
        let Some(s) = n.to_str() else { continue };
        if !s.starts_with("user.") {
            continue;
        }
        if let Ok(Some(v)) = xattr::get(path, &n) {
            pax.push((format!("SCHILY.xattr.{s}"), v));
        }
    }
    if pax.is_empty() {
        return Ok(());
    }
    b.append_pax_extensions(pax.iter().map(|(k, v)| (k.as_str(), v.as_slice())))
        .map_err(|e| StorageError::io(path, e))
}

/// The normal components of an archive path, or an error naming it.
fn clean(path: &Path, what: &str) -> Result<PathBuf, StorageError> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            _ => {
                return Err(StorageError::Failed(format!(
                    "refused: {what} {:?} is not a plain relative path",
                    path.display()
                )))
            }
        }
    }
    if out.as_os_str().is_empty() {
        return Err(StorageError::Failed(format!("refused: empty {what}")));
    }
    Ok(out)
}

/// Checks that every proper prefix of `rel` inside `root` is a real directory (not a
/// symlink), creating missing ones.
fn real_parents(root: &Path, rel: &Path) -> Result<(), StorageError> {
    let mut p = root.to_path_buf();
    let comps: Vec<_> = rel.components().collect();
    for c in &comps[..comps.len().saturating_sub(1)] {
        p.push(c);
        match p.symlink_metadata() {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(_) => {
                return Err(StorageError::Failed(format!(
                    "refused: {} goes through a non-directory {}",
                    rel.display(),
                    p.strip_prefix(root).unwrap_or(&p).display()
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&p).map_err(|e| StorageError::io(&p, e))?;
            }
            Err(e) => return Err(StorageError::io(&p, e)),
        }
    }
    Ok(())
}

/// Unpacks the archive read from `r` into `staging`, where the directory of each of
/// `vols` already exists (created by the backend: a directory, a subvolume or a
/// dataset's mountpoint), under the rules of the module docs. Returns the number of
/// entries written. `r` is read to its end of archive only; the caller checks the size
/// and digest of the whole stream.
pub fn unpack(staging: &Path, vols: &[String], r: &mut dyn Read) -> Result<u64, StorageError> {
    let mut ar = tar::Archive::new(r);
    ar.set_preserve_permissions(true);
    ar.set_preserve_ownerships(true);
    ar.set_preserve_mtime(true);
    // Extended attributes are applied below, `user.*` only.
    ar.set_unpack_xattrs(false);
    ar.set_overwrite(false);
    let bad = |e: std::io::Error| StorageError::Failed(format!("reading the archive: {e}"));
    let mut n = 0u64;
    // (path, mtime) of each directory: what the end needs, not the 512-byte header, so
    // an archive of millions of directories costs their paths and no more.
    let mut dirs: Vec<(PathBuf, u64)> = Vec::new();
    for entry in ar.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let raw = entry.path().map_err(bad)?.into_owned();
        let rel = clean(&raw, "path")?;
        let top = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .unwrap_or("");
        if !vols.iter().any(|v| v == top) {
            return Err(StorageError::Failed(format!(
                "refused: {} is not under a volume of the snapshot ({})",
                rel.display(),
                vols.join(", ")
            )));
        }
        let kind = entry.header().entry_type();
        use tar::EntryType as T;
        match kind {
            T::Regular
            | T::Continuous
            | T::GNUSparse
            | T::Directory
            | T::Symlink
            | T::Link
            | T::Fifo => {}
            other => {
                return Err(StorageError::Failed(format!(
                    "refused: {} is a {:?} entry (only directories, files, symlinks, hard links and fifos are accepted)",
                    rel.display(),
                    other
                )))
            }
        }
        real_parents(staging, &rel)?;
        let dst = staging.join(&rel);
        match dst.symlink_metadata() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Ok(m) if m.file_type().is_dir() && kind == T::Directory => {}
            Ok(_) => {
                return Err(StorageError::Failed(format!(
                    "refused: {} appears twice in the archive",
                    rel.display()
                )))
            }
            Err(e) => return Err(StorageError::io(&dst, e)),
        }
        if kind == T::Link {
            let target = entry
                .link_name()
                .map_err(bad)?
                .ok_or_else(|| {
                    StorageError::Failed(format!("{}: hard link without target", rel.display()))
                })?
                .into_owned();
            let target = clean(&target, "hard link target")?;
            real_parents(staging, &target)?;
            let src = staging.join(&target);
            match src.symlink_metadata() {
                Ok(m) if !m.file_type().is_dir() => {}
                _ => {
                    return Err(StorageError::Failed(format!(
                        "refused: hard link {} to {}, which is not an earlier file of the archive",
                        rel.display(),
                        target.display()
                    )))
                }
            }
            std::fs::hard_link(&src, &dst).map_err(|e| StorageError::io(&dst, e))?;
        } else if kind == T::Fifo {
            let h = entry.header();
            let mode = h.mode().map_err(bad)? & 0o7777;
            let (uid, gid) = (h.uid().map_err(bad)?, h.gid().map_err(bad)?);
            nix::unistd::mkfifo(&dst, nix::sys::stat::Mode::from_bits_truncate(0o600))
                .map_err(|e| StorageError::io(&dst, e.into()))?;
            std::os::unix::fs::lchown(&dst, Some(uid as u32), Some(gid as u32))
                .map_err(|e| StorageError::io(&dst, e))?;
            std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(mode))
                .map_err(|e| StorageError::io(&dst, e))?;
        } else {
            let xattrs = user_xattrs(&mut entry);
            entry
                .unpack(&dst)
                .map_err(|e| StorageError::Failed(format!("unpacking {}: {e}", rel.display())))?;
            if kind != T::Symlink {
                for (k, v) in xattrs {
                    match xattr::set(&dst, &k, &v) {
                        // A file system without xattrs (zfs-fuse) receives the rest.
                        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {}
                        r => r.map_err(|e| StorageError::io(&dst, e))?,
                    }
                }
            }
            if kind == T::Directory {
                dirs.push((dst, entry.header().mtime().unwrap_or(0)));
            }
        }
        n += 1;
    }
    // Directory mtimes last (their content changed them while unpacking).
    for (d, m) in dirs.iter().rev() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(*m);
        if let Ok(f) = std::fs::File::open(d) {
            let _ = f.set_modified(t);
        }
    }
    Ok(n)
}

/// The `user.*` extended attributes an entry's PAX header carries.
fn user_xattrs<R: Read>(entry: &mut tar::Entry<'_, R>) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    if let Ok(Some(exts)) = entry.pax_extensions() {
        for e in exts.flatten() {
            if let Ok(k) = e.key() {
                if let Some(name) = k.strip_prefix("SCHILY.xattr.") {
                    if name.starts_with("user.") {
                        out.push((name.to_string(), e.value_bytes().to_vec()));
                    }
                }
            }
        }
    }
    out
}

/// Compares what was read with what the sender's trailer says; the error names both.
pub fn check(got: &Shipped, want: &Shipped) -> Result<(), StorageError> {
    if got != want {
        return Err(StorageError::Failed(format!(
            "the archive does not match its trailer: received {} bytes with sha256 {}, the sender wrote {} bytes with sha256 {}",
            got.bytes, got.sha256, want.bytes, want.sha256
        )));
    }
    Ok(())
}

/// Unpacks the archive read from `r` (followed by its trailer) into `staging` (its
/// volume directories made by the backend), reading at most `limit` bytes of archive,
/// and checks its size and digest against the trailer. Returns what was received.
pub fn receive_into(
    staging: &Path,
    vols: &[String],
    r: &mut dyn Read,
    limit: u64,
) -> Result<Shipped, StorageError> {
    let mut tr = TrailerReader::new(r);
    let mut hr = HashingReader::new(&mut tr, limit);
    unpack(staging, vols, &mut hr)?;
    let got = hr
        .finish()
        .map_err(|e| StorageError::Failed(format!("reading the archive: {e}")))?;
    let want = tr.trailer()?;
    check(&got, &want)?;
    Ok(got)
}
