//! One session's rows: the transport alone (Hello, Echo), then the calls qcuda_bench times, sent
//! as guest-lib sends them, and the copies from registered guest RAM.

use std::time::Instant;

use qcuda_proto::{status, Checksum, HostRun, Op, BATCH_RECORD_SIZE, HOST_WINDOW_BASE};
use vhost_cuda::frontend::QueueWait;
use vm_memory::{Bytes, GuestAddress};

use crate::{
    report::{mean_us, Plan, Report},
    session::{Batch, RowError, Session},
    test_kernels,
    vm::PINNED_AT,
};

/// guest-lib's batch limit: what qcuda.ko copies into bounce memory.
const BATCH_BYTES: usize = 64 * 1024;

/// An empty kernel, as qcuda_bench launches (`empty_kernel<<<1, 1>>>`).
const EMPTY_PTX: &str = ".version 9.0\n.target sm_90\n.address_size 64\n\n\
                         .visible .entry qcuda_frontend_empty()\n{\n    ret;\n}\n";
const EMPTY_NAME: &str = "qcuda_frontend_empty";

/// The same session, waiting the other way: sleeping until the call eventfd.
fn blocking<'q>(s: &Session<'q>) -> Session<'q> {
    Session {
        queue: s.queue,
        id: s.id,
        wait: QueueWait::Block,
        timeout: s.timeout,
    }
}

fn wrong(what: String) -> RowError {
    RowError::Wrong(what)
}

/// hello_us, echo_us (0 B, 4 KiB), each also waited for on the call eventfd (`_block`).
pub fn transport_rows(r: &mut Report, plan: &Plan, s: &Session<'_>) {
    let n = plan.small_calls;
    for (metric, sess) in [("hello_us", s), ("hello_block_us", &blocking(s))] {
        r.counted_row(s.queue, metric, 0, "us", || {
            mean_us(n, |_| {
                let h = sess.ok(Op::Hello, &[u64::from(qcuda_proto::VERSION)])?;
                if h.rets[0] != u64::from(qcuda_proto::VERSION) {
                    return Err(wrong(format!("Hello says wire version {}", h.rets[0])));
                }
                Ok(())
            })
        });
    }
    for bytes in [0usize, 4096] {
        let data: Vec<u8> = (0..bytes).map(|i| (i * 7 + 3).to_le_bytes()[0]).collect();
        let sum = Checksum::of(&data);
        for (metric, sess) in [("echo_us", s), ("echo_block_us", &blocking(s))] {
            r.counted_row(s.queue, metric, bytes as u64, "us", || {
                mean_us(n, |_| {
                    let rep = sess.ok_with(Op::Echo, &[], &data, bytes)?;
                    if rep.out != data || rep.resp.rets[0] != sum {
                        return Err(wrong(format!("Echo of {bytes} bytes came back different")));
                    }
                    Ok(())
                })
            });
        }
    }
}

/// hop_nodev_us: without a GPU, a DeviceSynchronize still crosses the hop to the session's
/// worker, which answers cudaErrorNoDevice (or another CUDA error): that round trip.
pub fn no_device_row(r: &mut Report, plan: &Plan, s: &Session<'_>) {
    r.counted_row(s.queue, "hop_nodev_us", 0, "us", || {
        let (v, how) = mean_us(plan.small_calls, |_| {
            let rep = s.call(Op::DeviceSynchronize, &[], &[], 0)?;
            if rep.resp.status == status::SUCCESS {
                return Err(wrong(
                    "DeviceSynchronize succeeded on a host without a GPU".into(),
                ));
            }
            Ok(())
        })?;
        Ok((
            v,
            format!("{how}; DeviceSynchronize answered by the worker without a device"),
        ))
    });
}

/// Launch arguments of a <<<1, 1>>> launch of `func` on `stream`.
fn launch_args(func: u64, stream: u64) -> [u64; 7] {
    let one_one = 1 | (1 << 32);
    [func, one_one, one_one, one_one, 0, stream, 0]
}

/// The rows that need a GPU: synchronisations and queries, module load, launches, 4-byte
/// copies, cudaMalloc + cudaFree.
pub fn gpu_rows(r: &mut Report, plan: &Plan, s: &Session<'_>) {
    let n = plan.small_calls;
    let b = blocking(s);
    for (metric, sess) in [
        ("device_sync_idle_us", s),
        ("device_sync_idle_block_us", &b),
    ] {
        r.counted_row(s.queue, metric, 0, "us", || {
            mean_us(n, |_| sess.ok(Op::DeviceSynchronize, &[]).map(drop))
        });
    }
    let stream = match s.ok(Op::StreamCreate, &[0, 0]) {
        Ok(resp) => resp.rets[0],
        Err(e) => {
            eprintln!("frontend: StreamCreate: {e}; the stream rows are left out");
            0
        }
    };
    if stream != 0 {
        for (metric, sess) in [
            ("stream_sync_idle_us", s),
            ("stream_sync_idle_block_us", &b),
        ] {
            r.counted_row(s.queue, metric, 0, "us", || {
                mean_us(n, |_| sess.ok(Op::StreamSynchronize, &[stream]).map(drop))
            });
        }
        for (metric, sess) in [("stream_query_us", s), ("stream_query_block_us", &b)] {
            r.counted_row(s.queue, metric, 0, "us", || {
                mean_us(n, |_| {
                    let rep = sess.call(Op::StreamQuery, &[stream], &[], 0)?;
                    if rep.resp.status == status::NOT_READY {
                        return Err(wrong("StreamQuery of an idle stream said not ready".into()));
                    }
                    crate::session::success(Op::StreamQuery, &rep.resp)
                })
            });
        }
    }
    let fatbin = test_kernels::unhex(test_kernels::MIXED_FATBIN_HEX);
    r.counted_row(s.queue, "module_load_us", fatbin.len() as u64, "us", || {
        let mut total = 0.0;
        for i in 0..=plan.module_loads {
            let t = Instant::now();
            let m = s.ok_with(Op::ModuleLoad, &[], &fatbin, 0)?.resp.rets[0];
            if i > 0 {
                total += t.elapsed().as_secs_f64();
            }
            s.ok(Op::ModuleUnload, &[m])?;
        }
        Ok((
            total * 1e6 / f64::from(plan.module_loads.max(1)),
            format!(
                "mean of {}: ModuleLoad of nvcc's {}-byte fatbin (then an untimed unload)",
                plan.module_loads,
                fatbin.len()
            ),
        ))
    });
    let func = (|| -> Result<u64, RowError> {
        let mut ptx = EMPTY_PTX.as_bytes().to_vec();
        ptx.push(0);
        let module = s.ok_with(Op::ModuleLoad, &[], &ptx, 0)?.resp.rets[0];
        let f = s.ok_with(Op::ModuleGetFunction, &[module], EMPTY_NAME.as_bytes(), 64)?;
        Ok(f.resp.rets[0])
    })();
    match func {
        Ok(func) => launch_rows(r, plan, s, &b, func),
        Err(e) => {
            eprintln!("frontend: loading the empty kernel: {e}; the launch rows are left out");
        }
    }
    small_copy_rows(r, plan, s);
    r.counted_row(s.queue, "malloc_free_1m_us", 1 << 20, "us", || {
        mean_us(plan.malloc_free, |_| {
            let p = s.ok(Op::Malloc, &[1 << 20])?.rets[0];
            s.ok(Op::Free, &[p]).map(drop)
        })
    });
}

/// launch_sync_us (and `_block`): a launch and cudaDeviceSynchronize, which guest-lib sends as
/// one waited batch; launch_async_us: launches gathered into full batches sent fire-and-forget,
/// then one synchronisation, per launch.
fn launch_rows(r: &mut Report, plan: &Plan, s: &Session<'_>, b: &Session<'_>, func: u64) {
    let args = launch_args(func, 0);
    for (metric, sess) in [("launch_sync_us", s), ("launch_sync_block_us", b)] {
        r.counted_row(s.queue, metric, 0, "us", || {
            mean_us(plan.launch_sync, |_| {
                let mut batch = Batch::default();
                batch.push(Op::LaunchKernel, &args, &[]);
                sess.batch_with_tail(batch, Op::DeviceSynchronize, &[])
                    .map(drop)
            })
        });
    }
    r.counted_row(s.queue, "launch_async_us", 0, "us", || {
        let n = plan.launch_async;
        let mut batch = Batch::default();
        batch.push(Op::LaunchKernel, &args, &[]);
        s.batch_with_tail(batch, Op::DeviceSynchronize, &[])?;
        let t = Instant::now();
        let mut batch = Batch::default();
        let mut batches = 0u64;
        for _ in 0..n {
            // Room is kept for the synchronising tail the last batch ends with.
            if batch.len() + 2 * BATCH_RECORD_SIZE > BATCH_BYTES {
                s.post_batch(&batch)?;
                batches += 1;
                batch = Batch::default();
            }
            batch.push(Op::LaunchKernel, &args, &[]);
        }
        s.batch_with_tail(batch, Op::DeviceSynchronize, &[])?;
        Ok((
            t.elapsed().as_secs_f64() * 1e6 / f64::from(n.max(1)),
            format!(
                "{n} launches in {} batches, the last ending in a synchronize",
                batches + 1
            ),
        ))
    });
}

/// memcpy4_h2d_us, memcpy4_d2h_us: cudaMemcpy of 4 bytes of pageable memory, one waited
/// request each (the bytes travel in bounce memory).
fn small_copy_rows(r: &mut Report, plan: &Plan, s: &Session<'_>) {
    let n = plan.small_calls;
    let dev = match s.ok(Op::Malloc, &[4]) {
        Ok(resp) => resp.rets[0],
        Err(e) => {
            eprintln!("frontend: Malloc(4): {e}; the 4-byte copy rows are left out");
            return;
        }
    };
    r.counted_row(s.queue, "memcpy4_h2d_us", 4, "us", || {
        let res = mean_us(n, |i| {
            let v = 0x1000u32 + i;
            s.ok_with(Op::MemcpyHtoD, &[dev, 0], &v.to_le_bytes(), 0)
                .map(drop)
        })?;
        let got = s.ok_with(Op::MemcpyDtoH, &[dev, 0], &[], 4)?.out;
        let want = (0x1000u32 + n - 1).to_le_bytes();
        if got != want {
            return Err(wrong(format!(
                "the device holds {got:?} after the last copy, not {want:?}"
            )));
        }
        Ok(res)
    });
    r.counted_row(s.queue, "memcpy4_d2h_us", 4, "us", || {
        let want = 0xfeed_f00du32.to_le_bytes();
        s.ok_with(Op::MemcpyHtoD, &[dev, 0], &want, 0)?;
        mean_us(n, |_| {
            let got = s.ok_with(Op::MemcpyDtoH, &[dev, 0], &[], 4)?.out;
            if got != want {
                return Err(wrong(format!("read {got:?}, expected {want:?}")));
            }
            Ok(())
        })
    });
    let _ = s.ok(Op::Free, &[dev]);
}

/// Word `i` of pattern `seed` (qcuda_bench's).
#[expect(
    clippy::cast_possible_truncation,
    reason = "the pattern mixes the index's low and high 32 bits, as qcuda_bench's does"
)]
fn pattern(i: u64, seed: u32) -> u32 {
    ((i as u32)
        .wrapping_mul(0x9E37_79B1)
        .wrapping_add((i >> 32) as u32))
        ^ seed
}

/// Bytes [`fill`] and [`verify`] handle at a time.
const CHUNK: usize = 1 << 20;

/// The length of the next chunk of `bytes` from `at`.
fn chunk(bytes: u64, at: u64) -> usize {
    usize::try_from(bytes - at).map_or(CHUNK, |left| left.min(CHUNK))
}

/// Writes pattern `seed` (or zeros) over `bytes` of the pinned memory.
fn fill(s: &Session<'_>, bytes: u64, seed: Option<u32>) -> Result<(), RowError> {
    let mem = &s.queue.vm().mem;
    let mut buf = vec![0u8; CHUNK];
    let mut at = 0;
    while at < bytes {
        let n = chunk(bytes, at);
        for (j, w) in (at / 4..).zip(buf[..n].chunks_exact_mut(4)) {
            let v = seed.map_or(0, |seed| pattern(j, seed));
            w.copy_from_slice(&v.to_le_bytes());
        }
        mem.write_slice(&buf[..n], GuestAddress(PINNED_AT + at))
            .map_err(|e| wrong(format!("writing guest RAM: {e}")))?;
        at += n as u64;
    }
    Ok(())
}

/// Checks that `bytes` of the pinned memory hold pattern `seed`.
fn verify(s: &Session<'_>, bytes: u64, seed: u32, what: &str) -> Result<(), RowError> {
    let mem = &s.queue.vm().mem;
    let mut buf = vec![0u8; CHUNK];
    let mut at = 0;
    while at < bytes {
        let n = chunk(bytes, at);
        mem.read_slice(&mut buf[..n], GuestAddress(PINNED_AT + at))
            .map_err(|e| wrong(format!("reading guest RAM: {e}")))?;
        for (i, w) in (at / 4..).zip(buf[..n].chunks_exact(4)) {
            let got = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            if got != pattern(i, seed) {
                return Err(wrong(format!(
                    "{what}: guest word {i} is {got:#010x}, expected {:#010x}",
                    pattern(i, seed)
                )));
            }
        }
        at += n as u64;
    }
    Ok(())
}

/// h2d_pinned and d2h_pinned at each size: cudaMemcpyAsync between device memory and
/// registered guest RAM (qcuda.ko's `HostMap` of the pages, as cudaMallocHost memory is) on a
/// stream, then cudaStreamSynchronize: one waited batch of a `MemcpyMapped` and the
/// synchronisation. The first copy each way is checked; the best of several runs counts.
pub fn copy_rows(r: &mut Report, plan: &Plan, s: &Session<'_>, sizes: &[u64]) {
    let Some(&largest) = sizes.iter().max() else {
        return;
    };
    let setup = (|| -> Result<(u64, u64), RowError> {
        let stream = s.ok(Op::StreamCreate, &[0, 0])?.rets[0];
        let run = HostRun {
            gpa: PINNED_AT,
            len: largest,
        };
        let mapped = s
            .ok_with(
                Op::HostMap,
                &[HOST_WINDOW_BASE, largest, 0],
                &run.encode(),
                0,
            )?
            .resp
            .rets[0];
        Ok((stream, mapped))
    })();
    let (stream, mapped) = match setup {
        Ok(v) => v,
        Err(e) => {
            for &bytes in sizes {
                for metric in ["h2d_pinned", "d2h_pinned"] {
                    let why = format!("a stream and registered guest RAM: {e}");
                    r.row(metric, bytes, "GB/s", || Err(RowError::Setup(why)));
                }
            }

            return;
        }
    };
    for &bytes in sizes {
        let dev = match s.ok(Op::Malloc, &[bytes]) {
            Ok(resp) => resp.rets[0],
            Err(e) => {
                eprintln!("frontend: Malloc({bytes}): {e}");
                continue;
            }
        };
        let copy = |dst: u64, src: u64| -> Result<f64, RowError> {
            let t = Instant::now();
            let mut batch = Batch::default();
            batch.push(Op::MemcpyMapped, &[dst, src, bytes, stream], &[]);
            s.batch_with_tail(batch, Op::StreamSynchronize, &[stream])?;
            Ok(t.elapsed().as_secs_f64())
        };
        let best = |dst: u64, src: u64| -> Result<(f64, String), RowError> {
            let first = copy(dst, src)?;
            // Repeated until about `plan.target` is spent, 5 to 1000 times.
            let mut runs = 5u32;
            while runs < 1000 && f64::from(runs) * first < plan.target.as_secs_f64() {
                runs += 1;
            }
            let mut best = first;
            for _ in 1..runs {
                best = best.min(copy(dst, src)?);
            }
            Ok((bytes as f64 / best / 1e9, format!("best of {runs}")))
        };
        let seed = 0x5a5a_0000u32 ^ u32::try_from(bytes >> 20).unwrap_or(0);
        r.counted_row(s.queue, "h2d_pinned", bytes, "GB/s", || {
            fill(s, bytes, Some(seed))?;
            copy(dev, mapped)?;
            best(dev, mapped)
        });
        r.counted_row(s.queue, "d2h_pinned", bytes, "GB/s", || {
            // The device holds the pattern h2d put there: clear the guest side, copy back.
            fill(s, bytes, None)?;
            copy(mapped, dev)?;
            verify(s, bytes, seed, "d2h_pinned after h2d_pinned")?;
            best(mapped, dev)
        });
        let _ = s.ok(Op::Free, &[dev]);
    }
    let _ = s.ok(Op::HostUnmap, &[HOST_WINDOW_BASE]);
    let _ = s.ok(Op::StreamDestroy, &[stream]);
}
