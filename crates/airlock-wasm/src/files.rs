//! The writable folders' usage, for a sandbox whose folders are not on a
//! tmpfs of their own (a host without namespaces): there the disk caps are
//! measured, as nothing else can hold them.

use std::fs;
use std::path::Path;

/// What a set of folders holds: bytes allocated and entries (inodes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DiskUsage {
    pub bytes: u64,
    pub inodes: u64,
}

/// Adds up what `roots` hold, without following links, stopping early once
/// either count passes its cap (the answer is then "over", not exact).
pub(crate) fn usage(roots: &[&Path], byte_cap: u64, inode_cap: u64) -> DiskUsage {
    use std::os::unix::fs::MetadataExt;
    let mut total = DiskUsage::default();
    let mut stack: Vec<std::path::PathBuf> = roots.iter().map(|r| r.to_path_buf()).collect();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            // DirEntry::metadata does not follow links.
            let Ok(meta) = entry.metadata() else { continue };
            total.inodes += 1;
            // Allocated blocks, as a filesystem quota counts them: a sparse
            // file costs what it holds, not its length.
            total.bytes = total.bytes.saturating_add(meta.blocks().saturating_mul(512));
            if meta.is_dir() {
                stack.push(entry.path());
            }
            if total.bytes > byte_cap || total.inodes > inode_cap {
                return total;
            }
        }
    }
    total
}
