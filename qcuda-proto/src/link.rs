// SPDX-License-Identifier: Apache-2.0 OR MIT
//! The in-buffer of [`crate::Op::Link`]: the JIT options of `cuLinkCreate` and the inputs that
//! `cuLinkAddData` gathered, which the host links with its driver in one go.
//!
//! Layout, little-endian: option count u32 @0, input count u32 @4; then per option its
//! `CUjit_option` u32, 4 zero bytes and its value u64 (the option's value as the driver takes it
//! in a `void *`); then per input its `CUjitInputType` u32, name length u32, data length u64,
//! the name bytes (no NUL), the data bytes, and zero bytes up to a multiple of 8.

/// Bytes before the options.
pub const LINK_HEADER: usize = 8;
/// Bytes of one option record.
pub const LINK_OPTION: usize = 16;
/// Bytes of an input record before its name.
pub const LINK_INPUT_HEADER: usize = 16;
/// `CUjitInputType` values run from `CU_JIT_INPUT_CUBIN` (0) to `CU_JIT_INPUT_NVVM` (5).
pub const LINK_INPUT_TYPES: u32 = 6;

/// One JIT option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkOption {
    /// The `CUjit_option`.
    pub id: u32,
    /// Its value.
    pub value: u64,
}

/// One input to link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkInput<'a> {
    /// The `CUjitInputType`.
    pub kind: u32,
    /// The name the input is reported under in logs.
    pub name: &'a [u8],
    /// The image: PTX text, a cubin, a fatbin, an object, a library or NVVM IR.
    pub data: &'a [u8],
}

/// A decoded, fully checked `Link` in-buffer.
#[derive(Debug, Clone, Copy)]
pub struct LinkRequest<'a> {
    bytes: &'a [u8],
    options: usize,
    inputs: usize,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// The input record at `at`, and where the next one starts.
fn input_at(b: &[u8], at: usize) -> Option<(LinkInput<'_>, usize)> {
    let kind = u32_at(b, at)?;
    let name_len = usize::try_from(u32_at(b, at + 4)?).ok()?;
    let data_len = usize::try_from(u64_at(b, at + 8)?).ok()?;
    let name_at = at.checked_add(LINK_INPUT_HEADER)?;
    let data_at = name_at.checked_add(name_len)?;
    let end = data_at.checked_add(data_len)?;
    let next = end.checked_next_multiple_of(8)?;
    if b.get(end..next)?.iter().any(|&x| x != 0) {
        return None;
    }
    let input = LinkInput {
        kind,
        name: b.get(name_at..data_at)?,
        data: b.get(data_at..end)?,
    };
    Some((input, next))
}

impl<'a> LinkRequest<'a> {
    /// Checks the whole buffer: counts, every record inside it, zero padding, and nothing
    /// after the last input.
    pub fn decode(bytes: &'a [u8]) -> Option<Self> {
        let options = usize::try_from(u32_at(bytes, 0)?).ok()?;
        let inputs = usize::try_from(u32_at(bytes, 4)?).ok()?;
        let mut at = options.checked_mul(LINK_OPTION)?.checked_add(LINK_HEADER)?;
        for i in 0..options {
            if u32_at(bytes, LINK_HEADER + i * LINK_OPTION + 4)? != 0 {
                return None;
            }
        }
        for _ in 0..inputs {
            at = input_at(bytes, at)?.1;
        }
        (at == bytes.len()).then_some(Self {
            bytes,
            options,
            inputs,
        })
    }

    /// The options, in order.
    pub fn options(&self) -> impl Iterator<Item = LinkOption> + '_ {
        (0..self.options).map(|i| {
            let at = LINK_HEADER + i * LINK_OPTION;
            LinkOption {
                id: u32_at(self.bytes, at).unwrap_or_default(),
                value: u64_at(self.bytes, at + 8).unwrap_or_default(),
            }
        })
    }

    /// The inputs, in the order they were added.
    pub fn inputs(&self) -> impl Iterator<Item = LinkInput<'a>> + '_ {
        let mut at = LINK_HEADER + self.options * LINK_OPTION;
        let bytes = self.bytes;
        (0..self.inputs).filter_map(move |_| {
            let (input, next) = input_at(bytes, at)?;
            at = next;
            Some(input)
        })
    }

    /// How many inputs there are.
    pub fn input_count(&self) -> usize {
        self.inputs
    }
}

/// Encodes a `Link` in-buffer, handing its bytes to `push` in order; `None` (nothing pushed)
/// if a count or a name length does not fit its u32.
pub fn encode_link(
    options: &[LinkOption],
    inputs: &[LinkInput<'_>],
    mut push: impl FnMut(&[u8]),
) -> Option<()> {
    let counts = [
        u32::try_from(options.len()).ok()?,
        u32::try_from(inputs.len()).ok()?,
    ];
    if inputs.iter().any(|i| u32::try_from(i.name.len()).is_err()) {
        return None;
    }
    push(&counts[0].to_le_bytes());
    push(&counts[1].to_le_bytes());
    for o in options {
        push(&o.id.to_le_bytes());
        push(&[0; 4]);
        push(&o.value.to_le_bytes());
    }
    for i in inputs {
        push(&i.kind.to_le_bytes());
        push(
            &u32::try_from(i.name.len())
                .unwrap_or(u32::MAX)
                .to_le_bytes(),
        );
        push(&(i.data.len() as u64).to_le_bytes());
        push(i.name);
        push(i.data);
        let end = i.name.len() + i.data.len();
        push(&[0; 8][..end.next_multiple_of(8) - end]);
    }
    Some(())
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;

    fn encoded(options: &[LinkOption], inputs: &[LinkInput<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_link(options, inputs, |b| out.extend_from_slice(b)).unwrap();
        out
    }

    #[test]
    fn round_trips_and_refuses_damage() {
        let options = [
            LinkOption { id: 12, value: 1 },
            LinkOption { id: 7, value: 3 },
        ];
        let inputs = [
            LinkInput {
                kind: 1,
                name: b"a.ptx",
                data: b".version 9.0\0",
            },
            LinkInput {
                kind: 0,
                name: b"",
                data: &[7; 16],
            },
        ];
        let b = encoded(&options, &inputs);
        assert_eq!(b.len() % 8, 0);
        let r = LinkRequest::decode(&b).unwrap();
        assert_eq!(r.options().collect::<Vec<_>>(), options);
        assert_eq!(r.inputs().collect::<Vec<_>>(), inputs);
        assert_eq!(r.input_count(), 2);
        // Truncated, lengthened, a non-zero pad, a length past the end.
        assert!(LinkRequest::decode(&b[..b.len() - 8]).is_none());
        let mut longer = b.clone();
        longer.extend_from_slice(&[0; 8]);
        assert!(LinkRequest::decode(&longer).is_none());
        let mut pad = b.clone();
        // The first input ends at 8 + 2 * 16 + 16 + 5 + 13 = 74; its padding runs to 80.
        pad[79] = 1;
        assert!(LinkRequest::decode(&pad).is_none());
        let mut huge = b.clone();
        let at = LINK_HEADER + 2 * LINK_OPTION + 8;
        huge[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(LinkRequest::decode(&huge).is_none());
        assert!(LinkRequest::decode(&[]).is_none());
    }
}
