//! Pre-copy rounds, the final save that refers to pre-copied chunks, and the restore from a
//! store, over the fake driver (which runs the hash kernel as the CPU reference).

use super::*;
use crate::cuda::{
    gpu_state::CheckpointError,
    precopy::{self, check_log, scan, write_chunk, ChunkKey, RoundFigures, CHUNK},
    saved_state::SavedState,
};

const MIB: u64 = 1 << 20;
/// A chunk's bytes, as an index.
const C: usize = 2 << 20;
const BIG_N: usize = 2 * C + 3;
const BIG: u64 = BIG_N as u64;

/// A session with an allocation of three chunks (the last of 3 bytes) and one of 100 bytes,
/// filled with patterns.
fn program(rig: &mut Rig) -> (GpuState, u64, u64) {
    let mut s = GpuState::open(&rig.host, 3);
    let (a, b) = (malloc(&mut s, BIG), malloc(&mut s, 100));
    ok(htod(rig, &mut s, a, &pattern(BIG_N), &[BIG_N]));
    ok(htod(rig, &mut s, b, &[0x5a; 100], &[100]));
    (s, a, b)
}

fn round(s: &mut GpuState, budget: u64, passes: u32) -> (RoundFigures, Vec<u8>) {
    let mut log = Vec::new();
    let f = s.precopy_round(budget, passes, &mut log).unwrap();
    let n = check_log(&log).unwrap();
    assert_eq!((n.chunks, n.bytes), (f.chunks, f.bytes));
    (f, log)
}

/// The chunks of allocation `a` (of `BIG` bytes) a log holds, by offset, each checked to hash
/// as it says.
fn sent(log: &[u8], a: u64) -> Vec<(u64, Vec<u8>)> {
    let index = scan(log).unwrap();
    precopy::chunks_of(BIG)
        .filter_map(|(offset, len)| {
            let key = ChunkKey {
                dev: 0,
                alloc: a,
                offset,
                len,
            };
            index.get(&key).map(|(h, bytes)| {
                assert_eq!(h, precopy::hash(bytes));
                (offset, bytes.to_vec())
            })
        })
        .collect()
}

#[test]
fn rounds_send_everything_once_then_only_what_changed_within_budget_and_passes() {
    let mut rig = Rig::new(1);
    let (mut s, a, b) = program(&mut rig);
    // Round 1: the budget (4 MiB) takes chunks 0 and 1 of `a`.
    let (f, log) = round(&mut s, 4 * MIB, 2);
    assert_eq!(
        f,
        RoundFigures {
            chunks: 2,
            bytes: 2 * CHUNK,
            pending: 3 + 100,
            pass: 1
        }
    );
    let whole = pattern(BIG_N);
    let got = sent(&log, a);
    assert_eq!(got.len(), 2);
    assert_eq!(got[1], (CHUNK, whole[C..2 * C].to_vec()));
    // The guest writes chunk 0 (sent) and chunk 2 (not yet): round 2 ends pass 1 with what it
    // had left, chunk 2 as it is now; pass 2 then finds chunk 0 changed.
    assert!(rig.fake.poke(a + 10, b"changed"));
    assert!(rig.fake.poke(a + 2 * CHUNK, &[9]));
    let (f, log) = round(&mut s, 4 * MIB, 2);
    assert_eq!(
        f,
        RoundFigures {
            chunks: 2,
            bytes: 103,
            pending: CHUNK,
            pass: 2
        }
    );
    let index = scan(&log).unwrap();
    let tail = index
        .get(&ChunkKey {
            dev: 0,
            alloc: a,
            offset: 2 * CHUNK,
            len: 3,
        })
        .unwrap();
    assert_eq!(tail.1, [9, whole[2 * C + 1], whole[2 * C + 2]]);
    let small = index
        .get(&ChunkKey {
            dev: 0,
            alloc: b,
            offset: 0,
            len: 100,
        })
        .unwrap();
    assert_eq!(small.1, [0x5a; 100]);
    // Round 3: chunk 0 again, with what the guest wrote; then no pass is left.
    let (f, log) = round(&mut s, 4 * MIB, 2);
    assert_eq!(
        f,
        RoundFigures {
            chunks: 1,
            bytes: CHUNK,
            pending: 0,
            pass: 2
        }
    );
    assert_eq!(&sent(&log, a)[0].1[10..17], b"changed");
    // From then on rounds send nothing, whatever changes.
    assert!(rig.fake.poke(a, &[1]));
    let (f, log) = round(&mut s, 4 * MIB, 2);
    assert_eq!((f.chunks, f.pending, log.len()), (0, 0, 0));
}

#[test]
fn a_round_always_goes_forward_and_no_passes_send_nothing() {
    let mut rig = Rig::new(1);
    let (mut s, _, _) = program(&mut rig);
    // A budget under a chunk still sends one.
    let (f, _) = round(&mut s, 1, 3);
    assert_eq!((f.chunks, f.bytes), (1, CHUNK));
    s.precopy_reset();
    assert!(!s.precopy_tracking());
    let (f, log) = round(&mut s, 64 * MIB, 0);
    assert_eq!(f, RoundFigures::default());
    assert!(log.is_empty());
    // A session with nothing allocated converges at once.
    let mut empty = GpuState::open(&rig.host, 4);
    let (f, _) = round(&mut empty, 64 * MIB, 2);
    assert_eq!((f.chunks, f.pending, f.pass), (0, 0, 1));
}

#[test]
fn allocations_freed_between_rounds_are_not_sent_and_leave_the_tracking() {
    let mut rig = Rig::new(1);
    let (mut s, a, b) = program(&mut rig);
    let (f, _) = round(&mut s, 2 * MIB, 2);
    assert_eq!(f.chunks, 1);
    ok(run(&mut s, Op::Free, &[b]));
    ok(run(&mut s, Op::Free, &[a]));
    let (f, log) = round(&mut s, 64 * MIB, 2);
    assert_eq!((f.chunks, f.pending, log.len()), (0, 0, 0));
    // The final save has nothing to refer to.
    let saved = SavedState::decode(&s.save().unwrap()).unwrap();
    assert!(saved.allocations.is_empty());
}

/// A session pre-copied in full, then chunk 1 of `a` written: its store, its final state
/// (by `save` and `save_into`), and the bytes each allocation holds.
struct Migrated {
    store: Vec<u8>,
    saved: Vec<u8>,
    streamed: Vec<u8>,
    a: (u64, Vec<u8>),
    b: (u64, Vec<u8>),
}

fn migrate(staging_half: usize) -> Migrated {
    let mut rig = Rig::with_staging(FakeDriver::new(1), staging_half);
    let (mut s, a, b) = program(&mut rig);
    let mut store = Vec::new();
    loop {
        let (f, log) = round(&mut s, 64 * MIB, 2);
        store.extend_from_slice(&log);
        if f.pending == 0 {
            break;
        }
    }
    assert!(s.precopy_tracking());
    // A state without contents (a handover's, the last stop's record) refers to nothing.
    let mut record = std::io::Cursor::new(Vec::new());
    let launches = rig.fake.calls("launch");
    s.save_for_handover_into(&mut record).unwrap();
    assert_eq!(rig.fake.calls("launch"), launches);
    let record = SavedState::decode(&record.into_inner()).unwrap();
    assert!(record.allocations.iter().all(|a| a.refs.is_empty()));
    assert!(rig.fake.poke(a + CHUNK + 5, b"after the rounds"));
    let saved = s.save().unwrap();
    let mut out = std::io::Cursor::new(Vec::new());
    let figures = s.save_into(&mut out).unwrap();
    // Only the changed chunk's bytes are carried.
    assert_eq!(figures.device_bytes, CHUNK);
    let (r, av) = dtoh(&mut rig, &mut s, a, BIG_N, &[BIG_N]);
    ok(r);
    let (r, bv) = dtoh(&mut rig, &mut s, b, 100, &[100]);
    ok(r);
    Migrated {
        store,
        saved,
        streamed: out.into_inner(),
        a: (a, av),
        b: (b, bv),
    }
}

#[test]
fn the_final_save_refers_to_unchanged_chunks_and_a_restore_from_the_store_gives_every_byte() {
    for half in [64, 1 << 20] {
        let m = migrate(half);
        assert_eq!(m.saved, m.streamed, "save and save_into agree");
        assert_eq!(&m.saved[8..12], &3u32.to_le_bytes());
        let state = SavedState::decode(&m.saved).unwrap();
        let a = state.allocations.iter().find(|x| x.ptr == m.a.0).unwrap();
        let offsets: Vec<u64> = a.refs.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, vec![0, 2 * CHUNK]);
        assert_eq!(a.contents, m.a.1[C..2 * C]);
        let b = state.allocations.iter().find(|x| x.ptr == m.b.0).unwrap();
        assert_eq!((b.refs.len(), b.contents.len()), (1, 0));

        // A destination: a fresh worker restores from the store, decoded or in place.
        let rig = Rig::new(1);
        let r = GpuState::restore_with_store(&rig.host, 3, &m.saved, Some(&m.store)).unwrap();
        assert_eq!(rig.fake.peek(m.a.0, BIG_N).unwrap(), m.a.1);
        assert_eq!(rig.fake.peek(m.b.0, 100).unwrap(), m.b.1);
        drop(r);
        let rig = Rig::new(1);
        let mut r = GpuState::open(&rig.host, 3);
        r.restore_saved_with_store(&m.streamed, Some(&m.store))
            .unwrap();
        assert_eq!(rig.fake.peek(m.a.0, BIG_N).unwrap(), m.a.1);
        assert_eq!(rig.fake.peek(m.b.0, 100).unwrap(), m.b.1);
    }
}

/// `f` over the store's records (key, hash, bytes), written again as a store.
fn edited_store(
    store: &[u8],
    f: impl Fn(&ChunkKey, &mut [u64; 2], &mut Vec<u8>) -> bool,
) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < store.len() {
        let word = |o: usize| u64::from_le_bytes(store[at + o..at + o + 8].try_into().unwrap());
        let key = ChunkKey {
            dev: u32::from_le_bytes(store[at..at + 4].try_into().unwrap()),
            alloc: word(4),
            offset: word(12),
            len: word(20),
        };
        let mut hash = [word(28), word(36)];
        let start = at + precopy::CHUNK_HEAD_LEN;
        let mut bytes = store[start..start + usize::try_from(key.len).unwrap()].to_vec();
        at = start + usize::try_from(key.len).unwrap();
        if f(&key, &mut hash, &mut bytes) {
            write_chunk(&mut out, key.dev, key.alloc, key.offset, &bytes, hash).unwrap();
        }
    }
    out
}

#[test]
fn a_store_missing_a_chunk_or_with_other_bytes_is_refused() {
    let m = migrate(64);
    let refused = |store: Option<&[u8]>, what: &str| {
        let rig = Rig::new(1);
        match GpuState::restore_with_store(&rig.host, 3, &m.saved, store) {
            Err(CheckpointError::Mismatch(e)) => assert!(e.contains(what), "{e}"),
            other => panic!("not refused: {other:?}"),
        }
        // Nothing stays behind.
        assert_eq!(rig.fake.live_contexts(), 0);
    };
    refused(None, "no pre-copy store");
    refused(Some(&[][..]), "missing from the store");
    let missing = edited_store(&m.store, |k, _, _| k.offset != 2 * CHUNK);
    refused(Some(&missing), "missing from the store");
    // Other bytes, hashed as they are: another hash than the state names.
    let other = edited_store(&m.store, |k, h, b| {
        if k.offset == 0 && k.len == CHUNK {
            b[0] ^= 1;
            *h = precopy::hash(b);
        }
        true
    });
    refused(Some(&other), "another hash");
    // Other bytes under the old hash: caught once written.
    let lying = edited_store(&m.store, |k, _, b| {
        if k.len == 100 {
            b[99] ^= 1;
        }
        true
    });
    refused(Some(&lying), "does not hash");
    // Not a store at all.
    let mut bad = m.store.clone();
    bad.truncate(bad.len() - 1);
    refused(Some(&bad), "pre-copy store");
    // A restore without pre-copy takes no store and needs none.
    let rig = Rig::new(1);
    let mut src = GpuState::open(&rig.host, 3);
    malloc(&mut src, 64);
    let plain = src.save().unwrap();
    assert_eq!(&plain[8..12], &2u32.to_le_bytes());
    drop(src);
    let rig = Rig::new(1);
    GpuState::restore_with_store(&rig.host, 3, &plain, None).unwrap();
}

#[test]
fn a_reset_forgets_the_rounds() {
    let mut rig = Rig::new(1);
    let (mut s, _, _) = program(&mut rig);
    round(&mut s, 64 * MIB, 1);
    s.precopy_reset();
    let saved = SavedState::decode(&s.save().unwrap()).unwrap();
    assert!(saved.allocations.iter().all(|a| a.refs.is_empty()));
    // The next round starts again from nothing sent.
    let (f, _) = round(&mut s, 64 * MIB, 1);
    assert_eq!((f.chunks, f.bytes, f.pass), (4, BIG + 100, 1));
}

#[test]
fn the_kernel_hashes_what_the_reference_does_and_only_the_sessions_memory() {
    let mut rig = Rig::new(2);
    let (mut s, a, b) = program(&mut rig);
    let whole = pattern(BIG_N);
    let ranges = [
        (0, a, 1),
        (0, a + 1, 7),
        (0, a + 3, CHUNK - 3),
        (0, a, BIG),
        (0, b, 100),
        (0, b + 99, 0),
    ];
    let got = s.hash_chunks(&ranges).unwrap();
    let want: Vec<[u64; 2]> = [
        &whole[..1],
        &whole[1..8],
        &whole[3..C],
        &whole[..],
        &[0x5a; 100][..],
        &[][..],
    ]
    .iter()
    .map(|b| precopy::hash(b))
    .collect();
    assert_eq!(got, want);
    // Past an allocation, on a device without a context, or on no device: refused, and
    // nothing ran.
    let launches = rig.fake.calls("launch");
    s.hash_chunks(&[(0, a, BIG + 1)]).unwrap_err();
    s.hash_chunks(&[(1, a, 8)]).unwrap_err();
    s.hash_chunks(&[(7, a, 8)]).unwrap_err();
    assert_eq!(rig.fake.calls("launch"), launches);
    assert_eq!(s.hash_chunks(&[]).unwrap(), Vec::<[u64; 2]>::new());
}

/// The fuzz target's check over its seed and every flipped byte of it: restored or refused,
/// never a panic, nothing left behind.
#[cfg(feature = "fuzzing")]
#[test]
fn the_precopy_fuzz_seed_restores_and_its_mutations_are_refused_cleanly() {
    use crate::cuda::fuzzing::{restore_with_store, sample_precopy_input};
    let seed = sample_precopy_input();
    assert!(restore_with_store(&seed));
    // Every byte of the length and the store; of the state (the saved-state target's seed with
    // the reference), every 16th and its allocation records'.
    let n = u32::from_le_bytes(seed[..4].try_into().unwrap()) as usize;
    let state = &seed[4..4 + n];
    let chunks = state
        .windows(4)
        .position(|w| w == 14u32.to_le_bytes())
        .unwrap();
    let flipped = (0..4)
        .chain((4..4 + n).step_by(16))
        .chain(4 + chunks..4 + chunks + 80)
        .chain(4 + n..seed.len());
    for i in flipped {
        let mut b = seed.clone();
        b[i] ^= 0x81;
        restore_with_store(&b);
    }
    // Without the store's last byte: the chunk is missing, the restore refused.
    assert!(!restore_with_store(&seed[..seed.len() - 1]));
}

#[test]
fn a_round_during_a_stream_capture_sends_nothing_and_says_there_is_more() {
    let mut rig = Rig::new(1);
    let (mut s, _, _) = program(&mut rig);
    let stream = ok(run(&mut s, Op::StreamCreate, &[0, 0]))[0];
    ok(run(&mut s, Op::StreamBeginCapture, &[stream, 0]));
    let launches = rig.fake.calls("launch");
    let (f, log) = round(&mut s, 64 * MIB, 2);
    assert_eq!((f.chunks, f.pending, f.pass), (0, 1, 0));
    assert!(log.is_empty());
    assert_eq!(rig.fake.calls("launch"), launches);
    ok(run(&mut s, Op::StreamEndCapture, &[stream]));
    let (f, _) = round(&mut s, 64 * MIB, 2);
    assert_eq!((f.chunks, f.bytes), (4, BIG + 100));
}
