// SPDX-License-Identifier: Apache-2.0 OR MIT
//! `qcuda-smi selftest`: the transport end to end. Echo round trips over sizes that cross
//! every boundary the kernel module has (bounce vs pinned at `BOUNCE_THRESHOLD`, one buffer's
//! maximum at `MAX_BUFFER_LEN`, larger transfers split into calls), from aligned and unaligned
//! starts, each checked byte for byte and against the host's checksum; then calls the kernel
//! must refuse, each with the errno the ABI promises.

use std::{ops::Range, time::Instant};

use qcuda_proto::{
    ioctl::IoctlCall, status, Checksum, Direction, Op, BOUNCE_THRESHOLD, KNOWN_FLAGS, MAX_BUFFERS,
    MAX_BUFFER_LEN, VERSION,
};

use crate::{
    call_plan::{self, PAGE_LEN},
    device::{driver_version_text, echo_call, errno_name, status_name, Device},
    page_buffer::PageBuffer,
    prng::Prng,
    size::Size,
};

/// Echo sizes, smallest first: empty, tiny, odd, a page, the bounce threshold and one past it,
/// then pinned sizes up to one buffer's maximum and past it.
pub const ECHO_SIZES: &[u64] = &[
    0,
    1,
    7,
    4096,
    BOUNCE_THRESHOLD,
    BOUNCE_THRESHOLD + 1,
    1 << 20,
    16 << 20,
    MAX_BUFFER_LEN,
    256 << 20,
];

/// Where the in and out buffers start relative to a page boundary.
#[derive(Debug, Clone, Copy)]
struct Layout {
    name: &'static str,
    in_offset: usize,
    out_offset: usize,
}

const LAYOUTS: [Layout; 2] = [
    Layout {
        name: "aligned",
        in_offset: 0,
        out_offset: 0,
    },
    // Starts that make every pinned buffer span one more page than its length needs, with the
    // page crossings of input and output at different places.
    Layout {
        name: "unaligned",
        in_offset: 1,
        out_offset: PAGE_LEN - 3,
    },
];

/// Byte the output is filled with before each call, so that bytes the device never wrote show.
const POISON: u8 = 0xa5;

/// Options of `selftest`.
#[derive(Debug, Clone)]
pub struct SelftestOptions {
    /// Largest echo size.
    pub max_size: u64,
    /// Seed of the test data.
    pub seed: u64,
}

/// The sizes a run with `max_size` echoes: every listed size up to it, and `max_size` itself
/// when it is not listed.
pub fn echo_sizes(max_size: u64) -> Vec<u64> {
    let mut sizes: Vec<u64> = ECHO_SIZES
        .iter()
        .copied()
        .filter(|&s| s <= max_size)
        .collect();
    if !sizes.contains(&max_size) {
        sizes.push(max_size);
    }
    sizes
}

/// Runs the self-test; the error says what failed first.
pub fn run(dev: &Device, opts: &SelftestOptions) -> Result<(), String> {
    let hello = dev.hello().map_err(|e| format!("hello: {e}"))?;
    println!(
        "selftest: hello: host wire version {}, {} GPU(s), driver {}, {} session(s) open",
        hello.host_version,
        hello.gpu_count,
        if hello.driver_version == 0 {
            "none".to_string()
        } else {
            driver_version_text(hello.driver_version)
        },
        hello.sessions
    );
    if hello.host_version != u64::from(VERSION) {
        return Err(format!(
            "host speaks wire version {}, we speak {VERSION}",
            hello.host_version
        ));
    }

    echo_all_sizes(dev, opts)?;
    check_refusals(dev)?;

    // The session must still work after every refusal.
    let input = [0x5au8; 100];
    let mut output = [0u8; 100];
    let sum = dev
        .echo(&input, &mut output)
        .map_err(|e| format!("echo after the refusal checks: {e}"))?;
    if output != input || sum != Checksum::of(&input) {
        return Err("echo after the refusal checks returned wrong data".into());
    }
    println!("selftest: session still works after the refusals");
    println!("selftest: PASS");
    Ok(())
}

fn echo_all_sizes(dev: &Device, opts: &SelftestOptions) -> Result<(), String> {
    let sizes = echo_sizes(opts.max_size);
    let largest = *sizes.iter().max().expect("at least max_size");
    let room = usize::try_from(largest)
        .map_err(|_| format!("an echo of {} does not fit in memory", Size(largest)))?
        + PAGE_LEN * 2;
    let alloc = |what: &str| {
        PageBuffer::new(room)
            .map_err(|e| format!("cannot map {} for {what}: {e}", Size(room as u64)))
    };
    let mut input = alloc("echo input")?;
    let mut output = alloc("echo output")?;
    Prng::new(opts.seed).fill(input.as_mut_slice());
    println!(
        "selftest: echo {} sizes up to {} (seed {}), calls of at most {}",
        sizes.len(),
        Size(largest),
        opts.seed,
        Size(MAX_BUFFER_LEN)
    );

    for &size in &sizes {
        let mut line = format!("selftest: echo {:>10}", Size(size).to_string());
        let mut calls = 0;
        let mut notes = Vec::new();
        for layout in LAYOUTS {
            let run = echo_one(dev, &input, &mut output, size, layout)?;
            calls = run.calls;
            if let Some(piece) = run.split_to {
                notes.push(format!(
                    "{}: kernel refused calls as too large (E2BIG), split to {}",
                    layout.name,
                    Size(piece)
                ));
            }
            line += &format!(
                "  {} {:>7.1} MB/s {:>9}/call",
                layout.name,
                (size * run.reps) as f64 / run.secs / 1e6,
                duration_text(run.secs / (run.calls * run.reps) as f64)
            );
        }
        println!("{line}  {calls} call(s) each  ok");
        for n in notes {
            println!("selftest:   note: {n}");
        }
    }
    Ok(())
}

struct EchoRun {
    /// Calls per round trip of the whole size.
    calls: u64,
    /// Round trips made (small sizes are repeated for a steadier rate).
    reps: u64,
    /// Seconds spent in the calls, all round trips together.
    secs: f64,
    /// Set when the kernel refused pieces with E2BIG and they had to be cut smaller.
    split_to: Option<u64>,
}

/// A short duration for a report: microseconds below a millisecond, milliseconds above.
pub fn duration_text(secs: f64) -> String {
    if secs < 1e-3 {
        format!("{:.1} us", secs * 1e6)
    } else {
        format!("{:.1} ms", secs * 1e3)
    }
}

/// Round trips for a size: enough for about 1 MiB in all, between 1 and 200.
pub fn repetitions(size: u64) -> u64 {
    ((1u64 << 20) / size.max(1)).clamp(1, 200)
}

/// Echoes `size` bytes of `input` from `layout.in_offset` to `layout.out_offset` of `output`
/// and checks everything: per-call checksums, the copied bytes, and the bytes around them.
/// Only the calls are timed.
fn echo_one(
    dev: &Device,
    input: &PageBuffer,
    output: &mut PageBuffer,
    size: u64,
    layout: Layout,
) -> Result<EchoRun, String> {
    let n = usize::try_from(size)
        .map_err(|_| format!("an echo of {} does not fit in memory", Size(size)))?;
    let src = &input.as_slice()[layout.in_offset..layout.in_offset + n];
    let what = |piece: &Range<u64>| {
        format!(
            "echo {} ({}), bytes {}..{}",
            Size(size),
            layout.name,
            piece.start,
            piece.end
        )
    };
    let mut run = EchoRun {
        calls: 0,
        reps: repetitions(size),
        secs: 0.0,
        split_to: None,
    };

    for _ in 0..run.reps {
        let out = output.as_mut_slice();
        out[..layout.out_offset + n + 1].fill(POISON);
        let dst = &mut out[layout.out_offset..layout.out_offset + n];
        let mut answers: Vec<(Range<u64>, u64)> = Vec::new();
        let mut todo: Vec<Range<u64>> = call_plan::split(size, MAX_BUFFER_LEN);
        todo.reverse();
        let start = Instant::now();
        while let Some(piece) = todo.pop() {
            let (lo, hi) = (piece_start(&piece), piece_end(&piece));
            match dev.echo(&src[lo..hi], &mut dst[lo..hi]) {
                Ok(sum) => answers.push((piece, sum)),
                Err(e) if e.errno() == Some(libc::E2BIG) => {
                    let in_addr = input.addr(layout.in_offset + lo);
                    let out_addr = dst[lo..].as_ptr() as u64;
                    if call_plan::echo_fits_worst_case(in_addr, out_addr, piece.end - piece.start) {
                        return Err(format!(
                            "{}: refused with E2BIG although the chain needs at most {} \
                             descriptors",
                            what(&piece),
                            qcuda_proto::MAX_CHAIN_SEGMENTS
                        ));
                    }
                    let (a, b) = call_plan::halve(piece);
                    run.split_to = Some(run.split_to.unwrap_or(u64::MAX).min(a.end - a.start));
                    todo.push(b);
                    todo.push(a);
                }
                Err(e) => return Err(format!("{}: {e}", what(&piece))),
            }
        }
        run.secs += start.elapsed().as_secs_f64();
        run.calls = answers.len() as u64;

        for (piece, sum) in &answers {
            let want = Checksum::of(&src[piece_start(piece)..piece_end(piece)]);
            if *sum != want {
                return Err(format!(
                    "{}: host checksum {sum:#018x}, guest computes {want:#018x}",
                    what(piece)
                ));
            }
        }
        check_output(src, output.as_slice(), layout, size)?;
    }
    run.secs = run.secs.max(1e-9);
    Ok(run)
}

/// Where a piece of an echo starts in its buffer.
#[expect(
    clippy::cast_possible_truncation,
    reason = "pieces lie within 0..size, and echo_one checked that size fits in usize"
)]
fn piece_start(piece: &Range<u64>) -> usize {
    piece.start as usize
}

/// Where a piece of an echo ends in its buffer.
#[expect(
    clippy::cast_possible_truncation,
    reason = "pieces lie within 0..size, and echo_one checked that size fits in usize"
)]
fn piece_end(piece: &Range<u64>) -> usize {
    piece.end as usize
}

/// The output must equal the input, and the bytes just outside it must still be poison.
fn check_output(src: &[u8], out: &[u8], layout: Layout, size: u64) -> Result<(), String> {
    let n = src.len();
    let dst = &out[layout.out_offset..layout.out_offset + n];
    let name = format!("echo {} ({})", Size(size), layout.name);
    if let Some(i) = (0..n).find(|&i| dst[i] != src[i]) {
        let untouched = dst[i..].iter().take_while(|&&b| b == POISON).count();
        return Err(format!(
            "{name}: output differs from input at byte {i}: got {:#04x}, sent {:#04x}{}",
            dst[i],
            src[i],
            if untouched > 8 {
                format!(" ({untouched} bytes from there were never written)")
            } else {
                String::new()
            }
        ));
    }
    if layout.out_offset > 0 && out[layout.out_offset - 1] != POISON {
        return Err(format!(
            "{name}: the byte before the output buffer was overwritten"
        ));
    }
    if out[layout.out_offset + n] != POISON {
        return Err(format!(
            "{name}: the byte after the output buffer was overwritten"
        ));
    }
    Ok(())
}

/// What a refused call must produce.
enum Expect {
    /// The ioctl fails with one of these errnos.
    Errno(&'static [i32]),
    /// The ioctl fails with one of these errnos, or the device answers this status.
    ErrnoOrStatus(&'static [i32], u32),
}

/// Calls the kernel must refuse. Each is built by hand, since `IoctlCall::push` will not build
/// most of them.
fn check_refusals(dev: &Device) -> Result<(), String> {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "BOUNCE_THRESHOLD is 64 KiB, which fits in every usize"
    )]
    let bounce_len = BOUNCE_THRESHOLD as usize;
    let mut small = PageBuffer::new(2 * bounce_len + PAGE_LEN)
        .map_err(|e| format!("cannot map a test buffer: {e}"))?;
    let read_only = PageBuffer::read_only(2 * bounce_len)
        .map_err(|e| format!("cannot map a read-only test buffer: {e}"))?;
    let half = small.len() / 2;
    let (a, b) = (small.addr(0), small.addr(half));
    small.as_mut_slice().fill(1);
    let pinned = BOUNCE_THRESHOLD + 1;
    // Unmapped in every process: the zero page region, and kernel space.
    const LOW: u64 = 0x10;
    const KERNEL: u64 = 0xffff_8880_0000_0000;

    let mut cases: Vec<(String, IoctlCall, Expect)> = Vec::new();
    let mut unknown = IoctlCall::new(Op::Hello);
    unknown.op = 0x7fff_0000;
    cases.push((
        "unknown op".into(),
        unknown,
        Expect::ErrnoOrStatus(&[libc::EINVAL], status::NOT_SUPPORTED),
    ));
    cases.push((
        "kernel-only op SessionClose".into(),
        IoctlCall::new(Op::SessionClose),
        Expect::Errno(&[libc::EINVAL, libc::EPERM, libc::EACCES]),
    ));
    let mut too_many = echo_call(a, b, 8);
    #[expect(
        clippy::cast_possible_truncation,
        reason = "MAX_BUFFERS is 8, which fits in u32"
    )]
    let max_buffers = MAX_BUFFERS as u32;
    too_many.nbufs = max_buffers + 1;
    cases.push((
        "too many buffers".into(),
        too_many,
        Expect::Errno(&[libc::EINVAL]),
    ));
    let mut wrong_shape = IoctlCall::new(Op::Echo);
    wrong_shape.push(Direction::In, a, 8).expect("fits");
    cases.push((
        "wrong buffer count for the op".into(),
        wrong_shape,
        Expect::Errno(&[libc::EINVAL]),
    ));
    let mut out_first = IoctlCall::new(Op::Echo);
    out_first.push(Direction::Out, b, 8).expect("fits");
    out_first.push(Direction::In, a, 8).expect("fits");
    cases.push((
        "Out before In".into(),
        out_first,
        Expect::Errno(&[libc::EINVAL]),
    ));
    let mut bad_dir = echo_call(a, b, 8);
    bad_dir.bufs[1].dir = 3;
    cases.push((
        "unknown direction".into(),
        bad_dir,
        Expect::Errno(&[libc::EINVAL]),
    ));
    let mut reserved = echo_call(a, b, 8);
    reserved.bufs[0].reserved = 1;
    cases.push((
        "reserved buffer field set".into(),
        reserved,
        Expect::Errno(&[libc::EINVAL]),
    ));
    let mut flags = echo_call(a, b, 8);
    flags.flags = u32::from(!KNOWN_FLAGS);
    cases.push((
        "unknown flags".into(),
        flags,
        Expect::Errno(&[libc::EINVAL]),
    ));
    cases.push((
        "buffer over MAX_BUFFER_LEN".into(),
        echo_call(a, b, MAX_BUFFER_LEN + 1),
        Expect::Errno(&[libc::EINVAL, libc::E2BIG]),
    ));
    for (path, len) in [("bounce", 64u64), ("pinned", pinned)] {
        let cases_for = [
            ("bad input pointer", echo_call(LOW, b, len)),
            ("bad output pointer", echo_call(a, LOW, len)),
            ("kernel-space input pointer", echo_call(KERNEL, b, len)),
            ("kernel-space output pointer", echo_call(a, KERNEL, len)),
            (
                "input wrapping the address space",
                echo_call(u64::MAX - 16, b, len),
            ),
            ("read-only output", echo_call(a, read_only.addr(0), len)),
        ];
        for (name, call) in cases_for {
            cases.push((
                format!("{name} ({path})"),
                call,
                Expect::Errno(&[libc::EFAULT]),
            ));
        }
    }

    for (name, mut call, expect) in cases {
        // SAFETY: the buffers these calls name are either live mappings of this function
        // (`small`, writable; `read_only`, which the kernel must refuse to write) or addresses
        // mapped in no user process; the calls are malformed on purpose and must be refused.
        let result = unsafe { dev.call_raw(&mut call) };
        let got = match &result {
            Err(e) => e.raw_os_error().map(errno_name).unwrap_or("?").to_string(),
            Ok(()) => format!("status {}", status_name(call.status)),
        };
        let ok = match (&expect, &result) {
            (Expect::Errno(allowed), Err(e)) | (Expect::ErrnoOrStatus(allowed, _), Err(e)) => {
                e.raw_os_error().is_some_and(|n| allowed.contains(&n))
            }
            (Expect::ErrnoOrStatus(_, want), Ok(())) => call.status == *want,
            (Expect::Errno(_), Ok(())) => false,
        };
        let by = if result.is_ok() { "host" } else { "kernel" };
        if !ok {
            let want = match expect {
                Expect::Errno(e) => names(e),
                Expect::ErrnoOrStatus(e, s) => format!("{} or status {}", names(e), status_name(s)),
            };
            return Err(format!("{name}: got {got}, expected {want}"));
        }
        println!("selftest: refused {name}: {got} (by the {by})");
    }

    // An ioctl command the module does not know.
    let mut call = IoctlCall::new(Op::Hello);
    match dev.unknown_ioctl(&mut call) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTTY) => {
            println!("selftest: refused unknown ioctl command: ENOTTY (by the kernel)");
        }
        other => {
            return Err(format!(
                "unknown ioctl command: got {:?}, expected ENOTTY",
                other.map_err(|e| e.to_string())
            ))
        }
    }
    Ok(())
}

fn names(errnos: &[i32]) -> String {
    errnos
        .iter()
        .map(|&n| errno_name(n))
        .collect::<Vec<_>>()
        .join(" or ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call_plan::PAGE_SIZE;

    #[test]
    fn sizes_cover_the_boundaries() {
        let all = echo_sizes(256 << 20);
        assert_eq!(all, ECHO_SIZES);
        assert!(all.contains(&BOUNCE_THRESHOLD));
        assert!(all.contains(&(BOUNCE_THRESHOLD + 1)));
        assert!(all.contains(&MAX_BUFFER_LEN));
        assert!(all.iter().any(|&s| s > MAX_BUFFER_LEN));
        assert!(all.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(duration_text(0.000_003_14), "3.1 us");
        assert_eq!(duration_text(0.215_859), "215.9 ms");
    }

    #[test]
    fn small_sizes_repeat_large_ones_do_not() {
        assert_eq!(repetitions(0), 200);
        assert_eq!(repetitions(1), 200);
        assert_eq!(repetitions(4096), 200);
        assert_eq!(repetitions(BOUNCE_THRESHOLD), 16);
        assert_eq!(repetitions(1 << 20), 1);
        assert_eq!(repetitions(256 << 20), 1);
    }

    #[test]
    fn max_size_limits_and_extends_the_list() {
        assert_eq!(echo_sizes(7), vec![0, 1, 7]);
        assert_eq!(*echo_sizes(100 << 20).last().unwrap(), 100 << 20);
        assert_eq!(echo_sizes(0), vec![0]);
    }

    #[test]
    fn layouts_cross_pages_differently() {
        let [aligned, unaligned] = LAYOUTS;
        assert_eq!((aligned.in_offset, aligned.out_offset), (0, 0));
        assert_ne!(unaligned.in_offset % PAGE_LEN, 0);
        assert_ne!(unaligned.out_offset % PAGE_LEN, 0);
        assert_ne!(unaligned.in_offset, unaligned.out_offset);
        // A pinned MAX_BUFFER_LEN buffer then touches one page more than its length.
        assert_eq!(
            call_plan::buffer_segments(unaligned.in_offset as u64, MAX_BUFFER_LEN),
            MAX_BUFFER_LEN / PAGE_SIZE + 1
        );
    }
}
