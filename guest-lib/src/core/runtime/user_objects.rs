//! User objects (`cudaUserObjectCreate`/`Retain`/`Release`, `cudaGraphRetainUserObject`/
//! `ReleaseUserObject`, and the driver's `cuUserObject*`/`cuGraph*UserObject`), for both faces:
//! a reference-counted object of the program's whose destructor CUDA calls when the last
//! reference goes, references that graphs and executable graphs own among them. It concerns only
//! the guest process (the destructor is the program's function), so it is kept here, with the
//! graphs' and executable graphs' references following CUDA's rules:
//!
//! - a graph's references go when it is destroyed; a clone of it owns copies of them; a child
//!   graph node's graph (a copy, or the graph itself when moved) brings its references to the
//!   node's graph; an executable graph owns copies of its graph's references from its
//!   instantiation, replaced by the new graph's at a whole-graph update;
//! - references an executable graph owns are released only once its launches are done: each
//!   launch of an executable graph that owns references is followed by an event on its stream,
//!   which the release waits for.
//!
//! Destructors run on a thread of this library's, never inside a CUDA call (CUDA allows that:
//! `cudaUserObjectNoDestructorSync` is the only flag, and a destructor must not call CUDA).

use core::ffi::{c_uint, c_void};
use std::{
    collections::HashMap,
    sync::{mpsc, Mutex, OnceLock, PoisonError},
};

use crate::{
    core::cuda_error::{CudaError, CudaResult},
    core::runtime::Runtime,
    generated::cudaEventDisableTiming,
};

/// `cudaUserObjectNoDestructorSync`: the only flag, and required.
pub const NO_DESTRUCTOR_SYNC: c_uint = 1;
/// `cudaGraphUserObjectMove`: the caller's references become the graph's.
pub const GRAPH_USER_OBJECT_MOVE: c_uint = 1;

/// A destructor as CUDA calls it (`cudaHostFn_t`).
pub type Destructor = unsafe extern "C" fn(*mut c_void);

#[derive(Debug)]
struct Object {
    data: usize,
    destroy: Destructor,
    refs: u64,
}

/// References by object handle.
type Refs = HashMap<usize, u64>;

#[derive(Debug, Default)]
struct Exec {
    refs: Refs,
    /// Stream (application handle) -> the event recorded after its latest launch there.
    launched: HashMap<usize, usize>,
}

#[derive(Debug, Default)]
struct Tables {
    objects: HashMap<usize, Object>,
    graphs: HashMap<u64, Refs>,
    execs: HashMap<u64, Exec>,
    next: usize,
}

static TABLES: Mutex<Option<Tables>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Tables) -> T) -> T {
    f(TABLES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert_with(Tables::default))
}

/// Work for the destructor thread: events to wait for, then references to drop, then
/// destructors to run.
struct Job {
    rt: Option<&'static Runtime>,
    events: Vec<usize>,
    release: Refs,
    destructors: Vec<(Destructor, usize)>,
}

// SAFETY: the destructors are plain C functions with the program's data, which CUDA calls
// from a thread of its own too; events are handles.
unsafe impl Send for Job {}

fn worker() -> &'static Mutex<mpsc::Sender<Job>> {
    static TX: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("qcuda-user-objects".into())
            .spawn(move || {
                for job in rx {
                    if let Some(rt) = job.rt {
                        for e in &job.events {
                            // A failed wait (a lost session) still ends in the release.
                            let _ = rt.events.synchronize(&rt.session, *e);
                            let _ = rt.events.destroy(&rt.session, *e);
                        }
                    }
                    let mut destructors = job.destructors;
                    if !job.release.is_empty() {
                        destructors.extend(with(|t| drop_refs(t, &job.release)));
                    }
                    for (destroy, data) in destructors {
                        // SAFETY: the program's destructor with its own data, called once,
                        // when its last reference went (CUDA's contract for user objects).
                        unsafe { destroy(data as *mut c_void) };
                    }
                }
            })
            .expect("qcuda: cannot start the user-object thread");
        Mutex::new(tx)
    })
}

fn run(job: Job) {
    if job.events.is_empty() && job.release.is_empty() && job.destructors.is_empty() {
        return;
    }
    let tx = worker().lock().unwrap_or_else(PoisonError::into_inner);
    let _ = tx.send(job);
}

/// Drops `refs` references in `t`; the destructors of objects that lost their last one.
fn drop_refs(t: &mut Tables, refs: &Refs) -> Vec<(Destructor, usize)> {
    let mut out = Vec::new();
    for (&h, &n) in refs {
        if let Some(o) = t.objects.get_mut(&h) {
            o.refs = o.refs.saturating_sub(n);
            if o.refs == 0 {
                let o = t.objects.remove(&h).expect("present");
                out.push((o.destroy, o.data));
            }
        }
    }
    out
}

fn add_refs(t: &mut Tables, refs: &Refs) {
    for (&h, &n) in refs {
        if let Some(o) = t.objects.get_mut(&h) {
            o.refs += n;
        }
    }
}

/// `cudaUserObjectCreate`: the new object's handle, with `initial` references of the caller.
pub fn create(
    data: *mut c_void,
    destroy: Option<Destructor>,
    initial: c_uint,
    flags: c_uint,
) -> CudaResult<usize> {
    let destroy = destroy.ok_or(CudaError::INVALID_VALUE)?;
    if flags != NO_DESTRUCTOR_SYNC || initial == 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    Ok(with(|t| {
        // Handles are distinct small numbers, 16 apart, never zero.
        t.next += 16;
        let h = 0x5000_0000 + t.next;
        t.objects.insert(
            h,
            Object {
                data: data as usize,
                destroy,
                refs: u64::from(initial),
            },
        );
        h
    }))
}

/// `cudaUserObjectRetain`.
pub fn retain(object: usize, count: c_uint) -> CudaResult<()> {
    if count == 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    with(|t| {
        let o = t.objects.get_mut(&object).ok_or(CudaError::INVALID_VALUE)?;
        o.refs += u64::from(count);
        Ok(())
    })
}

/// `cudaUserObjectRelease`: the destructor runs when the last reference goes.
pub fn release(object: usize, count: c_uint) -> CudaResult<()> {
    if count == 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    let destructors = with(|t| {
        let o = t.objects.get(&object).ok_or(CudaError::INVALID_VALUE)?;
        if o.refs < u64::from(count) {
            return Err(CudaError::INVALID_VALUE);
        }
        Ok(drop_refs(t, &HashMap::from([(object, u64::from(count))])))
    })?;
    run(Job {
        rt: None,
        events: Vec::new(),
        release: Refs::new(),
        destructors,
    });
    Ok(())
}

/// `cudaGraphRetainUserObject`: `count` references for `graph` (taken from the caller's with
/// `cudaGraphUserObjectMove`, new ones otherwise).
pub fn graph_retain(graph: u64, object: usize, count: c_uint, flags: c_uint) -> CudaResult<()> {
    if count == 0 || graph == 0 || flags & !GRAPH_USER_OBJECT_MOVE != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    with(|t| {
        let o = t.objects.get_mut(&object).ok_or(CudaError::INVALID_VALUE)?;
        if flags & GRAPH_USER_OBJECT_MOVE == 0 {
            o.refs += u64::from(count);
        }
        *t.graphs
            .entry(graph)
            .or_default()
            .entry(object)
            .or_insert(0) += u64::from(count);
        Ok(())
    })
}

/// `cudaGraphReleaseUserObject`: `count` of `graph`'s references go.
pub fn graph_release(graph: u64, object: usize, count: c_uint) -> CudaResult<()> {
    if count == 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    let destructors = with(|t| {
        let held = t.graphs.get_mut(&graph).and_then(|r| r.get_mut(&object));
        match held {
            Some(n) if *n >= u64::from(count) => {
                *n -= u64::from(count);
                if *n == 0 {
                    t.graphs.get_mut(&graph).map(|r| r.remove(&object));
                }
            }
            _ => return Err(CudaError::INVALID_VALUE),
        }
        Ok(drop_refs(t, &HashMap::from([(object, u64::from(count))])))
    })?;
    run(Job {
        rt: None,
        events: Vec::new(),
        release: Refs::new(),
        destructors,
    });
    Ok(())
}

/// `graph` was destroyed: its references go.
pub fn graph_destroyed(graph: u64) {
    let destructors = with(|t| match t.graphs.remove(&graph) {
        Some(refs) => drop_refs(t, &refs),
        None => Vec::new(),
    });
    run(Job {
        rt: None,
        events: Vec::new(),
        release: Refs::new(),
        destructors,
    });
}

/// `copy` is a clone of `graph`: it owns copies of its references.
pub fn graph_cloned(graph: u64, copy: u64) {
    with(|t| {
        if let Some(refs) = t.graphs.get(&graph).cloned() {
            add_refs(t, &refs);
            t.graphs.insert(copy, refs);
        }
    });
}

/// A child graph node of `graph` holds `child` (a copy of it, or `child` itself when moved):
/// `graph` owns references of the child's objects from now on (a moved graph's own go to it).
pub fn child_added(graph: u64, child: u64, moved: bool) {
    with(|t| {
        let Some(refs) = (if moved {
            t.graphs.remove(&child)
        } else {
            t.graphs.get(&child).cloned()
        }) else {
            return;
        };
        if !moved {
            add_refs(t, &refs);
        }
        let into = t.graphs.entry(graph).or_default();
        for (h, n) in refs {
            *into.entry(h).or_insert(0) += n;
        }
    });
}

/// `exec` was instantiated from `graph`: it owns copies of the graph's references.
pub fn instantiated(graph: u64, exec: u64) {
    with(|t| {
        let refs = t.graphs.get(&graph).cloned().unwrap_or_default();
        add_refs(t, &refs);
        t.execs.insert(
            exec,
            Exec {
                refs,
                launched: HashMap::new(),
            },
        );
    });
}

/// Whether `exec` owns references (its launches are then followed by an event).
pub fn exec_holds(exec: u64) -> bool {
    with(|t| t.execs.get(&exec).is_some_and(|e| !e.refs.is_empty()))
}

/// `exec` was launched on `stream` (application handle): an event after it, which a release
/// of the executable graph's references waits for.
pub fn launched(rt: &'static Runtime, exec: u64, device: u32, stream: usize) -> CudaResult<()> {
    if !exec_holds(exec) {
        return Ok(());
    }
    let known = with(|t| {
        t.execs
            .get(&exec)
            .and_then(|e| e.launched.get(&stream).copied())
    });
    let event = match known {
        Some(e) => e,
        None => rt
            .events
            .create(&rt.session, device, cudaEventDisableTiming)?,
    };
    rt.events.record(&rt.session, &rt.streams, event, stream)?;
    with(|t| {
        if let Some(e) = t.execs.get_mut(&exec) {
            e.launched.insert(stream, event);
        }
    });
    Ok(())
}

/// `exec` now runs `graph` (a whole-graph update): its references become copies of the
/// graph's; the old ones go once the launches so far are done.
pub fn exec_updated(rt: &'static Runtime, exec: u64, graph: u64) {
    let (old, streams) = with(|t| {
        let refs = t.graphs.get(&graph).cloned().unwrap_or_default();
        add_refs(t, &refs);
        let e = t.execs.entry(exec).or_default();
        let old = std::mem::replace(&mut e.refs, refs);
        let streams: Vec<(usize, u32)> = e
            .launched
            .keys()
            .filter_map(|&s| rt.events.info(e.launched[&s]).ok().map(|i| (s, i.device)))
            .collect();
        (old, streams)
    });
    // Events after the launches so far (the executable graph keeps its own for later ones).
    let mut events = Vec::new();
    for (stream, device) in streams {
        if let Ok(ev) = rt
            .events
            .create(&rt.session, device, cudaEventDisableTiming)
        {
            if rt
                .events
                .record(&rt.session, &rt.streams, ev, stream)
                .is_ok()
            {
                events.push(ev);
            } else {
                let _ = rt.events.destroy(&rt.session, ev);
            }
        }
    }
    run(Job {
        rt: Some(rt),
        events,
        release: old,
        destructors: Vec::new(),
    });
}

/// `exec` was destroyed: its references go once its launches are done (the events recorded
/// after its latest launch on each stream are waited for on the destructor thread).
pub fn exec_destroyed(rt: &'static Runtime, exec: u64) {
    let Some(e) = with(|t| t.execs.remove(&exec)) else {
        return;
    };
    run(Job {
        rt: Some(rt),
        events: e.launched.into_values().collect(),
        release: e.refs,
        destructors: Vec::new(),
    });
}
