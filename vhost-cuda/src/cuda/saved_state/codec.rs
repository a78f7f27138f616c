//! The byte format of a saved state: [`Writer`] appends a record body's fields, [`Reader`]
//! reads them back, checking every read against what is left, and [`DecodeError`] says why
//! bytes are not a saved state. The records themselves are saved_state.rs's and graphs.rs's.

use std::ffi::CString;

use thiserror::Error;

/// The newest format version, which this build writes when a state needs it (version 3 added
/// allocations that refer to pre-copied chunks, `TAG_ALLOCATION_CHUNKS`).
pub(crate) const VERSION: u32 = 3;
/// The oldest version this build reads, and writes when a state needs nothing newer.
pub(crate) const OLDEST_VERSION: u32 = 2;

/// Why bytes are not a saved state.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    /// Not a saved state at all.
    #[error("not a qcuda saved state (bad magic)")]
    Magic,
    /// Written by another format version.
    #[error("saved-state format version {0}, this build reads {OLDEST_VERSION} to {VERSION}")]
    Version(u32),
    /// A length or count points past the end, or bytes are left over.
    #[error("saved state truncated or with trailing bytes at offset {0}")]
    Length(usize),
    /// A record of an unknown kind.
    #[error("unknown saved-state record {0} at offset {1}")]
    Tag(u32, usize),
    /// A field holds a value no capture writes.
    #[error("bad saved-state field: {0}")]
    Field(&'static str),
}

/// Appends fields of a record body.
#[derive(Default)]
pub(super) struct Writer(pub(super) Vec<u8>);

impl Writer {
    pub(super) fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub(super) fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(super) fn i32(&mut self, v: i32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(super) fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(super) fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u64(v.len() as u64);
        self.0.extend_from_slice(v);
        self
    }
    pub(super) fn opt_u32(&mut self, v: Option<u32>) -> &mut Self {
        self.u8(u8::from(v.is_some())).u32(v.unwrap_or(0))
    }
    pub(super) fn runs(&mut self, runs: &[(u64, u64)]) -> &mut Self {
        self.u64(runs.len() as u64);
        for &(gpa, len) in runs {
            self.u64(gpa).u64(len);
        }
        self
    }
}

/// Reads fields from a byte string, every read checked against what is left.
pub(super) struct Reader<'a> {
    bytes: &'a [u8],
    pub(super) at: usize,
    /// Offset of `bytes` in the whole input, for error messages.
    base: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn new(bytes: &'a [u8], base: usize) -> Self {
        Self { bytes, at: 0, base }
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or(DecodeError::Length(self.base + self.at))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    pub(super) fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    pub(super) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    pub(super) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub(super) fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_le_bytes(self.array()?))
    }
    pub(super) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub(super) fn len(&mut self) -> Result<usize, DecodeError> {
        let at = self.base + self.at;
        usize::try_from(self.u64()?).map_err(|_| DecodeError::Length(at))
    }
    pub(super) fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.len()?;
        self.take(n)
    }
    pub(super) fn flag(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::Field("flag")),
        }
    }
    pub(super) fn opt_u32(&mut self) -> Result<Option<u32>, DecodeError> {
        let some = self.flag()?;
        let v = self.u32()?;
        Ok(some.then_some(v))
    }
    pub(super) fn u32s<const N: usize>(&mut self) -> Result<[u32; N], DecodeError> {
        let mut a = [0u32; N];
        for v in &mut a {
            *v = self.u32()?;
        }
        Ok(a)
    }
    pub(super) fn name(&mut self) -> Result<CString, DecodeError> {
        CString::new(self.bytes()?).map_err(|_| DecodeError::Field("name"))
    }
    /// A count of items of at least `item` bytes each: refused if they cannot all be there.
    pub(super) fn count(&mut self, item: usize) -> Result<usize, DecodeError> {
        let at = self.base + self.at;
        let n = self.len()?;
        let room = (self.bytes.len() - self.at) / item.max(1);
        if n > room {
            return Err(DecodeError::Length(at));
        }
        Ok(n)
    }
    /// A run table: count, then (guest-physical address, length) pairs.
    pub(super) fn runs(&mut self) -> Result<Vec<(u64, u64)>, DecodeError> {
        let n = self.count(16)?;
        (0..n).map(|_| Ok((self.u64()?, self.u64()?))).collect()
    }
    pub(super) fn done(&self) -> Result<(), DecodeError> {
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(DecodeError::Length(self.base + self.at))
        }
    }
}
