// SPDX-License-Identifier: Apache-2.0 OR MIT
//! Byte sizes on the command line (`256M`, `64KiB`, `4096`) and in reports (`64 MiB`).

use std::fmt;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

/// Parses a size: a decimal number with an optional binary unit suffix, `K`/`KiB`, `M`/`MiB`,
/// `G`/`GiB` (case-insensitive, `B` allowed: `4kb`). Suffixes are powers of 1024.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    if digits.is_empty() {
        return Err(format!(
            "`{text}` is not a size (expected e.g. 4096, 64K, 256M)"
        ));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}`: number too large"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => KIB,
        "m" | "mb" | "mib" => MIB,
        "g" | "gb" | "gib" => GIB,
        other => return Err(format!("`{text}`: unknown unit `{other}` (use K, M or G)")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{text}`: size too large"))
}

/// A size for humans: exact binary units where they fit (`64 MiB`), bytes otherwise
/// (`65537 B`), so a report never rounds away the odd byte a test is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        let text = match n {
            0 => "0 B".to_string(),
            _ if n % GIB == 0 => format!("{} GiB", n / GIB),
            _ if n % MIB == 0 => format!("{} MiB", n / MIB),
            _ if n % KIB == 0 => format!("{} KiB", n / KIB),
            _ => format!("{n} B"),
        };
        // Honour width and alignment so reports can line up columns.
        f.pad(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_suffixed_sizes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("7b"), Ok(7));
        assert_eq!(parse_size("64K"), Ok(64 * 1024));
        assert_eq!(parse_size("64kib"), Ok(64 * 1024));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("256 MiB"), Ok(256 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size(" 2gb "), Ok(2 << 30));
    }

    #[test]
    fn rejects_malformed_sizes() {
        for bad in ["", "M", "-1", "1.5M", "12Q", "1MM", "99999999999999999999"] {
            assert!(parse_size(bad).is_err(), "{bad:?} parsed");
        }
        assert!(parse_size("17179869184G").is_err(), "overflow accepted");
    }

    #[test]
    fn formats_exact_units_or_bytes() {
        assert_eq!(Size(0).to_string(), "0 B");
        assert_eq!(Size(1).to_string(), "1 B");
        assert_eq!(Size(4096).to_string(), "4 KiB");
        assert_eq!(Size(65537).to_string(), "65537 B");
        assert_eq!(Size(64 << 20).to_string(), "64 MiB");
        assert_eq!(Size(3 << 30).to_string(), "3 GiB");
        assert_eq!(format!("{:>8}", Size(1024)), "   1 KiB");
    }
}
