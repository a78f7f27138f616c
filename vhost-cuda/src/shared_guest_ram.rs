//! Guest RAM shared with the worker processes.
//!
//! vhost-user hands the daemon guest RAM as file descriptors (QEMU's memfd or hugetlbfs
//! backend), which vhost-user-backend maps and keeps in each region's [`FileOffset`]. The daemon
//! describes its map as a table of [`RegionSpec`]s plus those descriptors
//! ([`region_table`]); a worker maps the same files itself ([`map_regions`]), so the bytes a
//! worker writes are the guest's bytes, with no copy through the daemon.
//!
//! The worker trusts the table no more than a chain: every region is checked (non-empty, no
//! overflow, inside its file) before it is mapped, and every run is later checked against the
//! resulting map, exactly as `chain.rs` checks runs against the daemon's.

use std::{fs::File, os::fd::AsRawFd, os::fd::RawFd};

use thiserror::Error;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use crate::guest_buffer::GuestRam;

/// One region of guest RAM: where it sits in guest-physical space and where in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionSpec {
    /// Guest-physical start.
    pub gpa: u64,
    /// Length in bytes.
    pub size: u64,
    /// Offset of the region in its file.
    pub file_offset: u64,
}

/// Why a memory table cannot be mapped.
#[derive(Debug, Error)]
pub enum MapError {
    /// Not one descriptor per region.
    #[error("{regions} regions but {files} file descriptors")]
    FdCount {
        /// Regions in the table.
        regions: usize,
        /// Descriptors that came with it.
        files: usize,
    },
    /// A region that cannot be valid.
    #[error("region {index}: {reason}")]
    BadRegion {
        /// Its index in the table.
        index: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// A region that reaches past the end of its file (touching it would raise SIGBUS).
    #[error("region {index} needs {needed} bytes of its file, which has {file_len}")]
    FileTooShort {
        /// Its index in the table.
        index: usize,
        /// Offset plus size.
        needed: u64,
        /// The file's size.
        file_len: u64,
    },
    /// The file cannot be inspected.
    #[error("region {index}: {error}")]
    File {
        /// Its index in the table.
        index: usize,
        /// The error.
        error: std::io::Error,
    },
    /// mmap failed, or regions overlap.
    #[error("cannot map guest RAM: {0}")]
    Map(String),
}

/// The daemon's map as a region table and the descriptor of each region, in order, for a
/// [`ToWorker::MemoryTable`](crate::worker::message::ToWorker::MemoryTable).
///
/// Regions that are not backed by a file (anonymous memory, which only tests use) cannot be
/// shared and are left out; their count is the third value. The descriptors belong to `mem` and
/// stay valid while it lives.
pub fn region_table(mem: &GuestRam) -> (Vec<RegionSpec>, Vec<RawFd>, usize) {
    let (mut regions, mut fds, mut skipped) = (Vec::new(), Vec::new(), 0);
    for r in mem.iter() {
        match r.file_offset() {
            Some(f) => {
                regions.push(RegionSpec {
                    gpa: r.start_addr().0,
                    size: r.len(),
                    file_offset: f.start(),
                });
                fds.push(f.file().as_raw_fd());
            }
            None => skipped += 1,
        }
    }
    (regions, fds, skipped)
}

/// Maps guest RAM from a region table and its descriptors (one per region, in order).
/// Whether `mem` already maps exactly `regions` of `files` (the same guest-physical ranges, at
/// the same offsets of the same files, by device and inode): a table sent again, as a daemon that
/// took the worker over after a restart does, then needs no new mapping (and the registrations of
/// the old one stay valid).
pub fn maps_the_same(mem: &GuestRam, regions: &[RegionSpec], files: &[File]) -> bool {
    use std::os::unix::fs::MetadataExt;
    let id = |f: &File| f.metadata().ok().map(|m| (m.dev(), m.ino()));
    regions.len() == files.len()
        && mem.num_regions() == regions.len()
        && regions.iter().zip(files).all(|(r, f)| {
            mem.iter().any(|m| {
                m.start_addr().0 == r.gpa
                    && m.len() == r.size
                    && m.file_offset().is_some_and(|fo| {
                        fo.start() == r.file_offset
                            && id(fo.file()).is_some()
                            && id(fo.file()) == id(f)
                    })
            })
        })
}

pub fn map_regions(regions: &[RegionSpec], files: Vec<File>) -> Result<GuestRam, MapError> {
    if regions.len() != files.len() {
        return Err(MapError::FdCount {
            regions: regions.len(),
            files: files.len(),
        });
    }
    let mut ranges = Vec::with_capacity(regions.len());
    for (index, (r, file)) in regions.iter().zip(files).enumerate() {
        let bad = |reason| MapError::BadRegion { index, reason };
        if r.size == 0 {
            return Err(bad("empty"));
        }
        let size = usize::try_from(r.size).map_err(|_| bad("larger than the address space"))?;
        r.gpa
            .checked_add(r.size)
            .ok_or(bad("guest-physical end overflows"))?;
        let needed = r
            .file_offset
            .checked_add(r.size)
            .ok_or(bad("file end overflows"))?;
        let meta = file
            .metadata()
            .map_err(|error| MapError::File { index, error })?;
        // Device files (device-dax) have no meaningful length; memfd, tmpfs and hugetlbfs
        // files do.
        if meta.is_file() && meta.len() < needed {
            return Err(MapError::FileTooShort {
                index,
                needed,
                file_len: meta.len(),
            });
        }
        ranges.push((
            GuestAddress(r.gpa),
            size,
            Some(FileOffset::new(file, r.file_offset)),
        ));
    }
    // vm-memory maps each region MAP_SHARED and refuses overlapping regions.
    GuestRam::from_ranges_with_files(ranges).map_err(|e| MapError::Map(e.to_string()))
}

#[cfg(test)]
mod tests {
    use std::os::fd::FromRawFd;

    use vm_memory::Bytes;

    use super::*;

    fn memfd(len: u64) -> File {
        // SAFETY: memfd_create with a valid NUL-terminated name returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(c"qcuda-ram-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(len).unwrap();
        f
    }

    fn dup(f: &File) -> File {
        f.try_clone().unwrap()
    }

    #[test]
    fn a_table_sent_again_is_recognised_and_another_is_not() {
        let file = memfd(0x30_0000);
        let regions = [
            RegionSpec {
                gpa: 0,
                size: 0x10_0000,
                file_offset: 0,
            },
            RegionSpec {
                gpa: 0x1_0000_0000,
                size: 0x20_0000,
                file_offset: 0x10_0000,
            },
        ];
        let mem = map_regions(&regions, vec![dup(&file), dup(&file)]).unwrap();
        // The same file through other descriptors (a new daemon's): the same table.
        assert!(maps_the_same(&mem, &regions, &[dup(&file), dup(&file)]));
        // Another file, another range, another offset, a region more or less: not.
        let other = memfd(0x30_0000);
        assert!(!maps_the_same(&mem, &regions, &[dup(&file), dup(&other)]));
        let mut moved = regions;
        moved[1].gpa += 0x1000;
        assert!(!maps_the_same(&mem, &moved, &[dup(&file), dup(&file)]));
        let mut shifted = regions;
        shifted[0].file_offset = 0x1000;
        assert!(!maps_the_same(&mem, &shifted, &[dup(&file), dup(&file)]));
        assert!(!maps_the_same(&mem, &regions[..1], &[dup(&file)]));
    }

    #[test]
    fn a_second_map_of_the_table_sees_the_same_bytes() {
        // Two regions in one file, as QEMU lays out RAM below and above 4 GiB.
        let file = memfd(0x30_0000);
        let mem = GuestRam::from_ranges_with_files([
            (
                GuestAddress(0),
                0x10_0000,
                Some(FileOffset::new(dup(&file), 0)),
            ),
            (
                GuestAddress(0x1_0000_0000),
                0x20_0000,
                Some(FileOffset::new(dup(&file), 0x10_0000)),
            ),
        ])
        .unwrap();
        let (regions, fds, skipped) = region_table(&mem);
        assert_eq!(skipped, 0);
        assert_eq!(
            regions,
            [
                RegionSpec {
                    gpa: 0,
                    size: 0x10_0000,
                    file_offset: 0
                },
                RegionSpec {
                    gpa: 0x1_0000_0000,
                    size: 0x20_0000,
                    file_offset: 0x10_0000
                }
            ]
        );
        // SAFETY: each fd is open (owned by `mem`); dup gives us our own copy.
        let files: Vec<File> = fds
            .iter()
            .map(|&fd| unsafe { File::from_raw_fd(libc::dup(fd)) })
            .collect();
        let other = map_regions(&regions, files).unwrap();
        mem.write_slice(b"low", GuestAddress(0x20)).unwrap();
        other
            .write_slice(b"high", GuestAddress(0x1_0000_0010))
            .unwrap();
        let mut b = [0u8; 4];
        other.read_slice(&mut b[..3], GuestAddress(0x20)).unwrap();
        assert_eq!(&b[..3], b"low");
        mem.read_slice(&mut b, GuestAddress(0x1_0000_0010)).unwrap();
        assert_eq!(&b, b"high");

        // Anonymous regions cannot be shared.
        let anon = GuestRam::from_ranges(&[(GuestAddress(0), 0x1000)]).unwrap();
        let (regions, fds, skipped) = region_table(&anon);
        assert_eq!((regions.len(), fds.len(), skipped), (0, 0, 1));
    }

    #[test]
    fn bad_tables_are_refused() {
        let spec = |gpa, size, file_offset| RegionSpec {
            gpa,
            size,
            file_offset,
        };
        let f = memfd(0x2000);
        let cases: Vec<(Vec<RegionSpec>, usize)> = vec![
            (vec![spec(0, 0x1000, 0)], 0),
            (vec![spec(0, 0, 0)], 1),
            (vec![spec(u64::MAX - 0xfff, 0x2000, 0)], 1),
            (vec![spec(0, 0x1000, u64::MAX - 10)], 1),
            (vec![spec(0, 0x3000, 0)], 1),
            (vec![spec(0, 0x1000, 0x1001)], 1),
            (vec![spec(0, 0x2000, 0), spec(0x1000, 0x1000, 0)], 2),
        ];
        for (regions, nfiles) in cases {
            let files = (0..nfiles).map(|_| dup(&f)).collect();
            assert!(
                map_regions(&regions, files).is_err(),
                "{regions:x?} accepted"
            );
        }
        map_regions(&[spec(0x1000, 0x1000, 0x1000)], vec![dup(&f)]).unwrap();
    }
}
