//! Driver objects as the driver layer hands them out: typed handles over raw values
//! (`driver_handles!`), which only this folder makes from a raw value or looks inside.

/// A driver object or pinned host pointer, as an integer: what the driver layer passes to
/// and gets from libcuda, and what the typed handles below wrap.
pub(crate) type Raw = usize;

/// Declares typed handles of driver objects. Only the driver layer (the `DriverApi`
/// implementations: `CudaDriver`, `NoDriver`, the test double) makes them from a raw value, so a
/// handle of one kind cannot be passed where the driver expects another: the session code only
/// stores what the driver returned and hands it back.
macro_rules! driver_handles {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(transparent)]
        pub(crate) struct $name($crate::cuda::driver::handles::Raw);

        impl $name {
            /// Wraps a value the driver returned. For the driver layer only.
            pub(in crate::cuda::driver) fn from_raw(raw: $crate::cuda::driver::handles::Raw) -> Self {
                Self(raw)
            }

            /// The value to hand to the driver. For the driver layer only.
            pub(in crate::cuda::driver) fn raw(self) -> $crate::cuda::driver::handles::Raw {
                self.0
            }
        }

        impl ::std::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                write!(f, "{}({:#x})", stringify!($name), self.0)
            }
        }
    )*};
}
pub(crate) use driver_handles;

driver_handles! {
    /// A `CUcontext`.
    Context;
    /// A `CUmodule`.
    Module;
    /// A `CUfunction`.
    Function;
    /// A `CUstream`; [`Stream::NULL`] is the context's legacy default stream.
    Stream;
    /// A `CUevent`.
    Event;
    /// A `CUmemoryPool`.
    MemPool;
}

impl Stream {
    /// The NULL stream: the context's legacy default stream.
    pub(crate) const NULL: Self = Self(0);
}

impl Event {
    /// The event as the value of a launch attribute (`DriverLaunchAttr`, which the driver
    /// reads as a `CUlaunchAttribute`) holds it.
    pub(crate) fn launch_attr_value(self) -> u64 {
        self.0 as u64
    }
}

/// The NULL stream: the context's legacy default stream.
pub(crate) const NULL_STREAM: Stream = Stream::NULL;

pub(crate) fn ptr<T>(raw: Raw) -> *mut T {
    raw as *mut T
}
