//! Module images from the guest, checked before the driver parses them.
//!
//! The guest library sends the whole fatbin an application registered (CUDA 13 compresses its
//! entries; the driver decompresses them and picks the cubin or PTX for the GPU), or a bare
//! cubin (ELF) or PTX text. The driver trusts the sizes inside an image, so a hostile image
//! that claims more bytes than it has would make the driver read past our copy. This module
//! copies the image out of guest memory (so the guest cannot change it after the check) and
//! checks what is cheap to check: the magic, and that every size in the fatbin header, the
//! fatbin entry headers, or the ELF header stays inside the image. It does not decompress or
//! interpret the payloads; that stays with the driver.

use qcuda_proto::status;

use super::aligned_bytes::AlignedBytes;
use crate::guest_buffer::GuestBuffer;

/// `fatBinaryHeader.magic`.
pub(crate) const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// Magic of the `__fatBinC_Wrapper_t` that points at a fatbin; the guest must send the fatbin
/// itself, not the wrapper (which holds guest pointers).
const FATBIN_WRAPPER_MAGIC: u32 = 0x4662_43b1;
const FATBIN_HEADER_LEN: usize = 16;
const FATBIN_ENTRY_MIN_HEADER: usize = 16;
const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
const ELF64_HEADER_LEN: usize = 64;
const ELF64_SHDR_LEN: usize = 64;
const ELF64_PHDR_LEN: usize = 56;
const SHT_NOBITS: u32 = 8;

/// What an image is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ImageKind {
    /// A fatbin (`0xBA55ED50` header and entries).
    Fatbin,
    /// A cubin: a 64-bit little-endian ELF file.
    Elf,
    /// PTX source text.
    Ptx,
}

/// A checked module image in host memory, NUL-terminated (PTX must be).
#[derive(Debug)]
pub(crate) struct ModuleImage {
    bytes: AlignedBytes,
    kind: ImageKind,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    let s = b.get(at..at.checked_add(2)?)?;
    Some(u16::from_le_bytes([s[0], s[1]]))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(4)?)?;
    let mut w = [0u8; 4];
    w.copy_from_slice(s);
    Some(u32::from_le_bytes(w))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    let s = b.get(at..at.checked_add(8)?)?;
    let mut w = [0u8; 8];
    w.copy_from_slice(s);
    Some(u64::from_le_bytes(w))
}

/// `at + len` as usize, if it fits and stays within `limit`.
fn end_within(at: u64, len: u64, limit: usize) -> Option<usize> {
    let end = usize::try_from(at.checked_add(len)?).ok()?;
    (end <= limit).then_some(end)
}

/// Checks a fatbin: header sizes, then entry headers tiling the declared payload.
fn check_fatbin(b: &[u8]) -> Option<()> {
    let header_len = u16_at(b, 6)? as usize;
    let fat_size = u64_at(b, 8)?;
    if header_len < FATBIN_HEADER_LEN {
        return None;
    }
    let end = end_within(header_len as u64, fat_size, b.len())?;
    let mut at = header_len;
    while at < end {
        let rest = b.get(at..end)?;
        if rest.len() < FATBIN_ENTRY_MIN_HEADER || rest.iter().all(|&x| x == 0) {
            // Trailing padding must be zeros.
            return rest.iter().all(|&x| x == 0).then_some(());
        }
        let entry_header = u32_at(b, at + 4)?;
        let payload = u64_at(b, at + 8)?;
        if (entry_header as usize) < FATBIN_ENTRY_MIN_HEADER {
            return None;
        }
        let entry_end = end_within(at as u64, u64::from(entry_header), end)?;
        at = end_within(entry_end as u64, payload, end)?;
    }
    Some(())
}

/// Checks a 64-bit little-endian ELF: the section and program header tables and every
/// section and segment with file contents lie inside the image.
fn check_elf(b: &[u8]) -> Option<()> {
    if b.len() < ELF64_HEADER_LEN || b[4] != 2 || b[5] != 1 {
        return None;
    }
    let phoff = u64_at(b, 0x20)?;
    let shoff = u64_at(b, 0x28)?;
    let phentsize = u16_at(b, 0x36)? as usize;
    let phnum = u64::from(u16_at(b, 0x38)?);
    let shentsize = u16_at(b, 0x3a)? as usize;
    let shnum = u64::from(u16_at(b, 0x3c)?);
    if phnum > 0 {
        if phentsize < ELF64_PHDR_LEN {
            return None;
        }
        end_within(phoff, phnum.checked_mul(phentsize as u64)?, b.len())?;
        for i in 0..phnum {
            let at = usize::try_from(phoff + i * phentsize as u64).ok()?;
            let offset = u64_at(b, at + 0x08)?;
            let filesz = u64_at(b, at + 0x20)?;
            end_within(offset, filesz, b.len())?;
        }
    }
    if shnum > 0 {
        if shentsize < ELF64_SHDR_LEN {
            return None;
        }
        end_within(shoff, shnum.checked_mul(shentsize as u64)?, b.len())?;
        for i in 0..shnum {
            let at = usize::try_from(shoff + i * shentsize as u64).ok()?;
            let kind = u32_at(b, at + 0x04)?;
            let offset = u64_at(b, at + 0x18)?;
            let size = u64_at(b, at + 0x20)?;
            if kind != SHT_NOBITS {
                end_within(offset, size, b.len())?;
            }
        }
    }
    Some(())
}

/// Checks PTX: text up to the first NUL (where the driver stops reading), without control
/// characters other than whitespace, containing a `.version` directive.
fn check_ptx(b: &[u8]) -> Option<()> {
    let text = b.split(|&c| c == 0).next()?;
    let plain = |c: &u8| *c >= 0x20 || matches!(*c, b'\t' | b'\n' | b'\r' | 0x0b | 0x0c);
    if !text.iter().all(plain) {
        return None;
    }
    text.windows(8).any(|w| w == b".version").then_some(())
}

/// What the image in `b` is, if it passes the checks; the status to answer otherwise.
pub(crate) fn classify(b: &[u8]) -> Result<ImageKind, u32> {
    if b.is_empty() {
        return Err(status::INVALID_VALUE);
    }
    let bad = status::INVALID_KERNEL_IMAGE;
    match u32_at(b, 0) {
        Some(FATBIN_MAGIC) => check_fatbin(b).map(|()| ImageKind::Fatbin).ok_or(bad),
        Some(FATBIN_WRAPPER_MAGIC) => Err(bad),
        _ if b.starts_with(ELF_MAGIC) => check_elf(b).map(|()| ImageKind::Elf).ok_or(bad),
        _ => check_ptx(b).map(|()| ImageKind::Ptx).ok_or(bad),
    }
}

impl ModuleImage {
    /// Copies and checks the image in `buf`.
    pub(crate) fn from_guest(buf: &GuestBuffer) -> Result<Self, u32> {
        let len = buf.len();
        if len == 0 {
            return Err(status::INVALID_VALUE);
        }
        // One spare zero byte terminates PTX that the guest sent without a NUL.
        let mut bytes = AlignedBytes::zeroed(len.checked_add(1).ok_or(status::INVALID_VALUE)?);
        buf.read_at(0, &mut bytes.as_mut_slice()[..len])
            .map_err(|_| status::INVALID_VALUE)?;
        Self::from_bytes(bytes, len)
    }

    /// Checks the first `len` bytes of `bytes` (which has at least one more, zero, byte).
    fn from_bytes(bytes: AlignedBytes, len: usize) -> Result<Self, u32> {
        let image = bytes.as_slice().get(..len).ok_or(status::INVALID_VALUE)?;
        let kind = classify(image)?;
        Ok(Self { bytes, kind })
    }

    /// A checked image from host bytes (a restored state's, tests, fuzz targets).
    pub(crate) fn from_slice(b: &[u8]) -> Result<Self, u32> {
        if b.is_empty() {
            return Err(status::INVALID_VALUE);
        }
        let mut bytes = AlignedBytes::zeroed(b.len() + 1);
        bytes.as_mut_slice()[..b.len()].copy_from_slice(b);
        Self::from_bytes(bytes, b.len())
    }

    /// The image alone, without the NUL byte the driver gets after it.
    pub(crate) fn image(&self) -> &[u8] {
        let b = self.bytes.as_slice();
        &b[..b.len().saturating_sub(1)]
    }

    /// The image followed by a NUL byte, as the driver gets it.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// What the image is.
    pub(crate) fn kind(&self) -> ImageKind {
        self.kind
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fatbin laid out as nvcc 13.0 writes it (header, then one ELF and one PTX entry with
    /// 64- and 80-byte entry headers), with dummy payloads.
    pub(crate) fn fatbin(payloads: &[(u16, u32, usize)]) -> Vec<u8> {
        let mut entries = Vec::new();
        for &(kind, header, payload) in payloads {
            let mut h = vec![0u8; header as usize];
            h[0..2].copy_from_slice(&kind.to_le_bytes());
            h[2..4].copy_from_slice(&0x0101u16.to_le_bytes());
            h[4..8].copy_from_slice(&header.to_le_bytes());
            h[8..16].copy_from_slice(&(payload as u64).to_le_bytes());
            entries.extend_from_slice(&h);
            entries.extend(std::iter::repeat_n(0x5a, payload));
        }
        let mut b = Vec::new();
        b.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&16u16.to_le_bytes());
        b.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        b.extend_from_slice(&entries);
        b
    }

    fn elf(sections: &[(u32, u64, u64)]) -> Vec<u8> {
        let mut b = vec![0u8; 64 + 64 * sections.len() + 64];
        b[..4].copy_from_slice(ELF_MAGIC);
        b[4] = 2;
        b[5] = 1;
        b[6] = 1;
        b[0x28..0x30].copy_from_slice(&64u64.to_le_bytes());
        b[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        b[0x3c..0x3e].copy_from_slice(&u16::try_from(sections.len()).unwrap().to_le_bytes());
        for (i, &(kind, off, size)) in sections.iter().enumerate() {
            let at = 64 + 64 * i;
            b[at + 4..at + 8].copy_from_slice(&kind.to_le_bytes());
            b[at + 0x18..at + 0x20].copy_from_slice(&off.to_le_bytes());
            b[at + 0x20..at + 0x28].copy_from_slice(&size.to_le_bytes());
        }
        b
    }

    #[test]
    fn real_tool_output_passes() {
        use crate::cuda::test_kernels::*;
        for (hex, kind) in [
            (MIXED_FATBIN_HEX, ImageKind::Fatbin),
            (MIXED_FATBIN_SIZE_HEX, ImageKind::Fatbin),
            (VADD_CUBIN_HEX, ImageKind::Elf),
        ] {
            let image = unhex(hex);
            assert_eq!(classify(&image), Ok(kind));
            // Any truncation of a real image is caught.
            for cut in [1, 17, image.len() / 2, image.len() - 1] {
                assert_eq!(
                    classify(&image[..cut]),
                    Err(status::INVALID_KERNEL_IMAGE),
                    "{kind:?} cut at {cut}"
                );
            }
        }
        assert_eq!(classify(VADD_PTX.as_bytes()), Ok(ImageKind::Ptx));
    }

    #[test]
    fn fatbins_as_nvcc_writes_them_pass() {
        let fb = fatbin(&[(2, 64, 6120), (1, 80, 552)]);
        assert_eq!(fb.len(), 6832); // the size of nvcc 13.0's vector-add fatbin
        assert_eq!(classify(&fb), Ok(ImageKind::Fatbin));
        // Trailing bytes after the declared size are the guest's business, not the driver's.
        let mut longer = fb.clone();
        longer.extend_from_slice(&[1, 2, 3]);
        assert_eq!(classify(&longer), Ok(ImageKind::Fatbin));
        // Zero padding inside the declared size is accepted.
        let mut padded = fatbin(&[(2, 64, 100)]);
        padded.extend_from_slice(&[0u8; 24]);
        let size = (padded.len() - 16) as u64;
        padded[8..16].copy_from_slice(&size.to_le_bytes());
        assert_eq!(classify(&padded), Ok(ImageKind::Fatbin));
    }

    #[test]
    fn fatbins_claiming_more_than_they_have_are_refused() {
        let bad = Err(status::INVALID_KERNEL_IMAGE);
        let fb = fatbin(&[(2, 64, 6120), (1, 80, 552)]);
        // Truncated image.
        assert_eq!(classify(&fb[..fb.len() - 1]), bad);
        assert_eq!(classify(&fb[..10]), bad);
        // Declared size too large / overflowing.
        let mut b = fb.clone();
        b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(classify(&b), bad);
        // Header size below 16.
        let mut b = fb.clone();
        b[6..8].copy_from_slice(&8u16.to_le_bytes());
        assert_eq!(classify(&b), bad);
        // An entry payload running past the fatbin.
        let mut b = fb.clone();
        b[16 + 8..16 + 16].copy_from_slice(&(6121u64).to_le_bytes());
        assert_eq!(classify(&b), bad);
        let mut b = fb.clone();
        b[16 + 8..16 + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(classify(&b), bad);
        // An entry header size below 16 (would loop or misparse).
        let mut b = fb.clone();
        b[16 + 4..16 + 8].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(classify(&b), bad);
        // Non-zero garbage where padding would be.
        let mut b = fatbin(&[(2, 64, 100)]);
        b.extend_from_slice(&[7u8; 8]);
        let size = (b.len() - 16) as u64;
        b[8..16].copy_from_slice(&size.to_le_bytes());
        assert_eq!(classify(&b), bad);
        // The registration wrapper instead of the fatbin.
        let mut w = vec![0u8; 24];
        w[..4].copy_from_slice(&FATBIN_WRAPPER_MAGIC.to_le_bytes());
        assert_eq!(classify(&w), bad);
    }

    #[test]
    fn elf_tables_and_sections_must_be_inside() {
        let ok = elf(&[(0, 0, 0), (1, 64, 64), (SHT_NOBITS, 0, 1 << 40)]);
        assert_eq!(classify(&ok), Ok(ImageKind::Elf));
        let bad = Err(status::INVALID_KERNEL_IMAGE);
        assert_eq!(classify(&elf(&[(1, 64, 1 << 20)])), bad);
        assert_eq!(classify(&elf(&[(1, u64::MAX, 2)])), bad);
        let mut b = elf(&[(1, 64, 64)]);
        b[0x28..0x30].copy_from_slice(&(1u64 << 32).to_le_bytes());
        assert_eq!(classify(&b), bad);
        let mut b = elf(&[(1, 64, 64)]);
        b[4] = 1; // 32-bit
        assert_eq!(classify(&b), bad);
        assert_eq!(classify(b"\x7fELF\x02\x01"), bad);
        // Program headers out of range.
        let mut b = elf(&[]);
        b[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        b[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        b[0x38..0x3a].copy_from_slice(&2u16.to_le_bytes());
        assert_eq!(classify(&b), bad);
    }

    #[test]
    fn ptx_text_gets_a_terminator() {
        let ptx = b".version 9.0\n.target sm_90\n.address_size 64\n";
        let img = ModuleImage::from_slice(ptx).unwrap();
        assert_eq!(img.kind(), ImageKind::Ptx);
        assert_eq!(img.as_bytes().last(), Some(&0));
        assert_eq!(&img.as_bytes()[..ptx.len()], ptx);
        // With its own NUL, and trailing junk after it that the driver never reads.
        ModuleImage::from_slice(b".version 9.0\0\x01\x02").unwrap();
        let bad = Err(status::INVALID_KERNEL_IMAGE);
        assert_eq!(classify(b"hello"), bad);
        assert_eq!(classify(b".version 9.0\x01"), bad);
        assert_eq!(classify(b"\0.version 9.0"), bad);
        assert_eq!(classify(b""), Err(status::INVALID_VALUE));
    }
}
